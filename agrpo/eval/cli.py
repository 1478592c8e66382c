"""agrpo eval +recipe=NAME [eval.adapter=PATH] [eval.k=4] [key=value ...]: score a base model or an adapter.

The arguments are the training command's Hydra overrides (+recipe= takes a recipe name or a YAML path), composed
with the same config tree, so the recipe's model, prompts, reward terms and replica settings are what the
evaluation uses, plus the eval.* keys below. It samples eval.k completions per test problem on fixed seeds (the base
model and an adapter see the same draws), scores them with the reward terms (called exactly as in training) and
prints a table: mean@k, pass@1, pass@k, mean reward, truncation, length.

Results (eval_results.jsonl, eval_summary.json, config.yaml) go to eval.output_dir; by default
<run dir>/eval/<date_time> when eval.adapter is a run's final_adapter, where `agrpo push <run dir>` finds them,
else outputs/eval/<run_name>/<date_time>. See docs/eval.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agrpo.errors import AgrpoError

if TYPE_CHECKING:
    from omegaconf import DictConfig

USAGE = __doc__.split(":", 1)[0]


def eval_keys_help() -> list[str]:
    """The eval.* keys with their defaults and why, from the schema's field docs (the help cannot drift from it)."""
    from agrpo.config.reference import knob_line
    from agrpo.config.schema import EvalConfig, walk

    return [line for knob in walk(EvalConfig, "eval.") for line in (f"  {knob_line(knob)}", f"    {knob.doc}")]


def help_text() -> str:
    body = __doc__.split("\n", 1)[1].strip()
    return "\n".join(
        [
            f"usage: {USAGE}",
            "",
            body,
            "",
            "eval.* keys (=default), from agrpo/config/schema (docs/config.md):",
            *eval_keys_help(),
        ]
    )


def run_dir_of(adapter: str | None) -> Path | None:
    """The run directory an adapter belongs to (<run dir>/final_adapter next to the run's config.yaml), if any."""
    if not adapter:
        return None
    folder = Path(adapter).expanduser().resolve()
    return folder.parent if (folder.parent / "config.yaml").is_file() else None


def output_dir(composed: DictConfig) -> Path:
    """eval.output_dir; else <run dir>/eval/<date_time> for a run's adapter; else outputs/eval/<run_name>/<date_time>
    under the working directory (as Hydra's run dirs). Read from the composed config: it is prepare's input
    (sync.output_dir)."""
    if composed.eval.output_dir:
        return Path(composed.eval.output_dir).expanduser().resolve()
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = run_dir_of(composed.eval.adapter)
    if run_dir is not None:
        return run_dir / "eval" / stamp
    return Path("outputs", "eval", str(composed.run_name), stamp).resolve()


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(help_text())
        return 0
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    # Rewards call math-verify with its timeouts off on purpose (docs/rewards.md); it warns on every call.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from datasets.utils import logging as datasets_logging

    datasets_logging.disable_progress_bar()  # loading a test file in milliseconds needs no bars; sampling has its own
    from agrpo.config.spec import write_spec

    try:
        from agrpo.config.prepare import compose_overrides, prepare
        from agrpo.eval.runner import run_eval
        from agrpo.eval.scoring import render_table

        composed = compose_overrides(list(argv))  # +recipe= takes a YAML path too
        out = output_dir(composed)
        composed.sync.output_dir = str(out)  # an input of prepare, as a Hydra run's own directory is
        cfg = prepare(composed, evaluating=True)  # the run's checks and eval's, then the spec (config/prepare.py)
        summary = run_eval(cfg, out)
    except AgrpoError as error:
        if os.environ.get("AGRPO_DEBUG") == "1":
            raise
        print(f"agrpo eval: error: {error}", file=sys.stderr)
        return error.exit_code
    what = f"adapter {cfg.eval.adapter}" if cfg.eval.adapter else "base model"
    print(render_table(summary, f"agrpo eval: {cfg.run_name}, {cfg.model.name_or_path}, {what}"))
    print(f"\nper-problem results: {out / cfg.eval.results_file}\nsummary: {out / cfg.eval.summary_file}")
    write_spec(cfg, out / "config.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
