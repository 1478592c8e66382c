"""`agrpo push RUN_DIR --repo-id NAME [--private] [--dry-run]`: publish a run's final adapter on the Hugging Face Hub.

Creates the model repo (kept if it exists) and commits, in one commit, the files of RUN_DIR/final_adapter with a
model card as README.md in place of peft's blank template: base model, recipe and resolved config, the training
curves picture (RUN_DIR/training_curves.png, when present), final metrics (metrics.json) and the `agrpo eval` table
(every eval_summary.json under RUN_DIR, plus --eval files), with snippets for vLLM and peft. A warm-started agent
run's adapter was trained on the warm start's model folder, which is uploaded beside it under warm_base/
(agrpo/agents/sharing.py says why), so the repo alone is enough to load and serve it.
The token is huggingface_hub's (HF_TOKEN, or `hf auth login`); HF_ENDPOINT is honoured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from agrpo.agents.sharing import (
    WARM_BASE,
    chat_template_text,
    context_length,
    live_tools,
    saved_tools,
    warm_base_of,
)
from agrpo.errors import AgrpoError, ConfigError, LaunchError
from agrpo.report.card import build_card

FINAL_ADAPTER = "final_adapter"
CURVES = "training_curves.png"
EVAL_SUMMARY = "eval_summary.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agrpo push", description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run_dir", type=Path, help="the run's directory (holds final_adapter/ and config.yaml)")
    parser.add_argument("--repo-id", required=True, help="NAME or OWNER/NAME of the model repo (NAME: your account)")
    parser.add_argument("--private", action="store_true", help="create the repo private (an existing repo is kept)")
    parser.add_argument("--dry-run", action="store_true", help="print the card and the files, upload nothing")
    parser.add_argument("--base-model", help="the base model's Hub id, when the run loaded it from a local folder")
    parser.add_argument(
        "--eval",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="an eval_summary.json (or its folder) from `agrpo eval`, e.g. of the base model",
    )
    return parser.parse_args(argv)


def is_hub_id(name: str) -> bool:
    """Whether a model name is a Hub repo id rather than a local folder."""
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find_evals(run_dir: Path, extra: list[Path]) -> list[dict[str, Any]]:
    """Eval summaries to show: --eval paths first (e.g. the base model), then those under the run dir."""
    paths = [p / EVAL_SUMMARY if p.is_dir() else p for p in extra]
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"--eval {path}: no such file (expected the {EVAL_SUMMARY} that `agrpo eval` wrote)")
    paths += sorted(p for p in run_dir.rglob(EVAL_SUMMARY) if p.resolve() not in {q.resolve() for q in paths})
    summaries = []
    for path in paths:
        summary = _read_json(path)
        if summary is None or "mean_at_k" not in summary:
            raise ConfigError(f"{path} is not an `agrpo eval` summary (no mean_at_k)")
        summaries.append(summary)
    return summaries


def training_command(run_dir: Path) -> str | None:
    """`python -m agrpo` plus the run's overrides as typed (a recipe file by its path: agrpo/config/recipe_files.py)."""
    from agrpo.config.recipe_files import typed_overrides

    if not (run_dir / ".hydra" / "overrides.yaml").is_file():
        return None
    return " ".join(["python -m agrpo", *(o for o in typed_overrides(run_dir) if not o.startswith("hydra."))])


def gather_run(run_dir: Path, repo_id: str, base_model: str | None, extra_evals: list[Path]) -> dict[str, Any]:
    """What the card is built from, read from the run dir; a run without a final adapter is refused."""
    from omegaconf import OmegaConf

    adapter = run_dir / FINAL_ADAPTER
    if not (adapter / "adapter_model.safetensors").is_file() or not (adapter / "adapter_config.json").is_file():
        raise ConfigError(
            f"{adapter} holds no peft adapter (adapter_model.safetensors + adapter_config.json): "
            "push a run directory whose training finished (it writes final_adapter/ at the end)"
        )
    config_path = run_dir / "config.yaml"
    config = OmegaConf.to_container(OmegaConf.load(config_path)) if config_path.is_file() else {}
    adapter_config = _read_json(adapter / "adapter_config.json") or {}
    base = (
        base_model or (config.get("model") or {}).get("name_or_path") or adapter_config.get("base_model_name_or_path")
    )
    if not base:
        raise ConfigError(f"{run_dir} does not say which base model it trained: pass --base-model OWNER/NAME")
    curves = run_dir / CURVES
    warm = warm_base_of(config)
    if warm is not None and base_model is None:
        base = warm["recipe_base"]
    return {
        "repo_id": repo_id,
        "base_model": str(base),
        "base_model_on_hub": is_hub_id(str(base)),
        "config": config,
        "metrics": _read_json(run_dir / "metrics.json"),
        "evals": find_evals(run_dir, extra_evals),
        "curves": CURVES if curves.is_file() else None,
        "command": training_command(run_dir),
        "warm_base": warm and {k: v for k, v in warm.items() if k != "folder"},
        "serving": serving(run_dir, config, warm),
    }


def serving(run_dir: Path, config: dict[str, Any], warm: dict[str, Any] | None) -> dict[str, Any]:
    """What the card's serve command and request need: the chat template's tool-call parser, the tools (as
    training rendered them), an example prompt and the model's own context length."""
    if warm is not None and not (warm["folder"] / "config.json").is_file():
        raise ConfigError(
            f"{run_dir} was trained on the warm start's model {warm['folder']}, which is gone: the adapter cannot be "
            "used without it. Rebuild it (run the same recipe with trainer.max_steps=0 in the same cache_dir: the "
            "warm start is rebuilt from its spec), or push from the machine that trained"
        )
    folder = warm["folder"] if warm else None
    tools = (saved_tools(folder) if folder else None) or live_tools(config)
    return {
        "template": chat_template_text(run_dir / FINAL_ADAPTER) or (chat_template_text(folder) if folder else None),
        "tools": tools,
        "example": warm.get("example") if warm else None,
        "max_model_len": (context_length(folder) if folder else None)
        or (config.get("inference") or {}).get("max_model_len"),
    }


def upload_files(run_dir: Path) -> dict[str, Path]:
    """Repo path -> local file: the adapter folder's files (its README replaced by the card), the curves, and a
    warm-started run's base model folder under warm_base/."""
    files = {p.name: p for p in sorted((run_dir / FINAL_ADAPTER).iterdir()) if p.is_file() and p.name != "README.md"}
    if (run_dir / CURVES).is_file():
        files[CURVES] = run_dir / CURVES
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        from omegaconf import OmegaConf

        warm = warm_base_of(OmegaConf.to_container(OmegaConf.load(config_path)))
        if warm is not None:
            files.update({f"{WARM_BASE}/{p.name}": p for p in sorted(warm["folder"].iterdir()) if p.is_file()})
    return files


def hub_token() -> str:
    """The saved or HF_TOKEN token; its absence, or offline mode, is a one-paragraph error."""
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ConfigError("HF_HUB_OFFLINE=1 is set: pushing needs the Hub; unset it (or use --dry-run)")
    token = huggingface_hub.get_token()
    if not token:
        raise ConfigError(
            "no Hugging Face token: run `hf auth login` or set HF_TOKEN to a token with write access "
            "(https://huggingface.co/settings/tokens); --dry-run shows the card without one"
        )
    return token


def push(run: dict[str, Any], files: dict[str, Path], private: bool) -> str:
    """Create the repo (exist_ok), then commit the files plus the card as README.md in one commit; return the URL.

    The card is built once the repo exists, so its snippets name the full OWNER/NAME even when NAME alone was given.
    """
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=hub_token())
    try:
        url = api.create_repo(run["repo_id"], repo_type="model", private=private, exist_ok=True)
        card = build_card({**run, "repo_id": url.repo_id})
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in files.items()]
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode()))
        api.create_commit(
            url.repo_id,
            operations,
            repo_type="model",
            commit_message=f"agrpo push: LoRA adapter of {run['base_model']}",
        )
    except HfHubHTTPError as error:
        raise LaunchError(f"the Hub refused the push to {run['repo_id']}: {error}") from None
    except OSError as error:  # connection refused, DNS, ...
        raise LaunchError(f"could not reach the Hub to push {run['repo_id']}: {error}") from None
    return str(url)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        run = gather_run(args.run_dir, args.repo_id, args.base_model, args.eval)
        files = upload_files(args.run_dir)
        if args.dry_run:
            print(build_card(run))
            owner = "" if "/" in args.repo_id else " (under your account: the card then names OWNER/NAME)"
            print(
                f"agrpo push: dry run, nothing uploaded. Would create {args.repo_id}{owner} "
                f"({'private' if args.private else 'public'}) with: README.md, {', '.join(files)}"
            )
            return 0
        url = push(run, files, args.private)
    except AgrpoError as error:
        if os.environ.get("AGRPO_DEBUG") == "1":
            raise
        print(f"agrpo push: error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"agrpo push: {len(files) + 1} files committed to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
