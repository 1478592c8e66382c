"""The model card of a pushed adapter: a pure function from what a run left behind to the README's markdown.

peft writes a blank template into the adapter folder; this card says what a reader needs instead: the base model,
how the adapter was trained (command, recipe settings, the resolved config), how it did (curves, final metrics,
the `agrpo eval` table) and how to use it (vLLM with --enable-lora, peft). `agrpo.report.push` gathers the inputs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from agrpo.agents.sharing import WARM_BASE, serve_flags
from agrpo.config.resolve import round_lora_rank
from agrpo.eval.scoring import markdown_table

# Config keys whose text values are never printed, should a future key hold a credential.
_SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$", re.IGNORECASE)


def lora_module_name(repo_id: str) -> str:
    """The adapter's name on a vLLM server: the repo's name (what requests put in `model`)."""
    return repo_id.rsplit("/", 1)[-1]


def redact(value: Any) -> Any:
    """The config with any credential-like key's value replaced."""
    if isinstance(value, Mapping):
        return {
            k: "<redacted>" if _SECRET_KEY.search(str(k)) and isinstance(v, str) and v else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def front_matter(run: Mapping[str, Any]) -> str:
    """The Hub's YAML header: base model (only a Hub id: a local path fails the Hub's validation), library, tags."""
    meta: dict[str, Any] = {}
    if run.get("base_model_on_hub"):
        meta["base_model"] = run["base_model"]
    meta["library_name"] = "peft"
    meta["pipeline_tag"] = "text-generation"
    tags = ["agrpo", "grpo", "lora", "trl"]
    if run.get("base_model_on_hub"):
        tags.append(f"base_model:adapter:{run['base_model']}")
    meta["tags"] = tags
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _reward_terms(config: Mapping[str, Any]) -> str:
    terms = []
    for term in _get(config, "reward.funcs", []) or []:
        if isinstance(term, Mapping):
            name = str(term.get("_target_", "?"))
            wrapped = term.get("reward")
            label = f"{name}({wrapped})" if isinstance(wrapped, str) else name
            terms.append(f"`{label}` x {term.get('weight', 1.0)}")
    return ", ".join(terms) or "-"


def _dataset(config: Mapping[str, Any]) -> str:
    name, path = _get(config, "data.name"), _get(config, "data.path")
    loader = str(_get(config, "data.loader", "")).rsplit(".", 1)[-1]
    source = name or (str(path).rsplit("/", 1)[-1] if path else None) or loader or "-"
    return f"`{source}` ({loader})" if loader and source != loader else f"`{source}`"


def base_row(run: Mapping[str, Any]) -> str:
    """The base model, and for a warm-started run what the warm start made of it."""
    warm = run.get("warm_base")
    if not warm:
        return f"`{run['base_model']}`"
    built = f" (built by `{warm['builder']}`)" if warm.get("builder") else ""
    return (
        f"`{run['base_model']}`{built}, warm-started by agrpo on this run's tools ({warm.get('steps')} supervised "
        f"steps at {warm.get('learning_rate')}): the result is `{WARM_BASE}/` in this repo, the adapter's base"
    )


def training_section(run: Mapping[str, Any]) -> list[str]:
    config = run.get("config") or {}
    rows = [
        ("base model", base_row(run)),
        ("recipe / run name", f"`{_get(config, 'run_name', '-')}`"),
        ("data", _dataset(config)),
        ("reward terms", _reward_terms(config)),
        (
            "LoRA",
            f"r={_get(config, 'lora.r')}, alpha={_get(config, 'lora.alpha')}, "
            f"targets {', '.join(_get(config, 'lora.target_modules', []) or [])}",
        ),
        ("steps", _get(config, "trainer.max_steps")),
        ("learning rate", _get(config, "trainer.learning_rate")),
        (
            "samples per step x generations per prompt",
            f"{_get(config, 'trainer.per_device_train_batch_size')} x {_get(config, 'trainer.num_generations')}",
        ),
        ("max completion tokens", _get(config, "trainer.max_completion_length")),
        ("max staleness (async)", _get(config, "trainer.max_staleness")),
        ("vLLM replicas", _get(config, "inference.replicas")),
    ]
    lines = ["## Training", ""]
    if run.get("command"):
        lines += ["```bash", str(run["command"]), "```", ""]
    lines += ["| setting | value |", "|---|---|"] + [f"| {key} | {value} |" for key, value in rows]
    if config:
        lines += [
            "",
            "<details><summary>Resolved config (config.yaml)</summary>",
            "",
            "```yaml",
            yaml.safe_dump(redact(config), sort_keys=False).rstrip(),
            "```",
            "",
            "</details>",
        ]
    return lines


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def results_section(run: Mapping[str, Any]) -> list[str]:
    lines = ["## Results", ""]
    if run.get("curves"):
        lines += [f"![Training curves]({run['curves']})", ""]
    metrics = run.get("metrics") or {}
    shown = [
        ("optimizer steps", "global_step"),
        ("mean reward, first 5 steps", "reward_first"),
        ("mean reward, last 5 steps", "reward_last"),
        ("mean step time (s)", "step_s_mean"),
        ("wall time (s)", "wall_time_s"),
    ]
    rows = [(label, metrics[key]) for label, key in shown if metrics.get(key) is not None]
    if rows:
        lines += ["| final metric | value |", "|---|---|"] + [f"| {k} | {_number(v)} |" for k, v in rows] + [""]
    evals = list(run.get("evals") or [])
    if evals:
        lines += ["### Evaluation (`agrpo eval`)", "", markdown_table(evals, eval_labels(evals)), ""]
        first = evals[0]
        lines += [
            f"Sampling: temperature {first.get('temperature')}, max_tokens {first.get('max_tokens')}; "
            "mean@k is the share of correct samples per problem, pass@k the share of problems with one.",
            "",
        ]
    if len(lines) == 2:
        lines += ["No metrics were recorded for this run.", ""]
    return lines


def serve_lines(run: Mapping[str, Any], rank: int, name: str) -> list[str]:
    """The `vllm serve` command (after a download for a warm-started run, whose base is in the repo): on the base
    the adapter was trained on, the tool-call flags its chat template needs and a context its prompts fit."""
    repo_id, base = run["repo_id"], run["base_model"]
    serving = run.get("serving") or {}
    local = f"./{name}"
    warm = bool(run.get("warm_base"))
    model, adapter = (f"{local}/{WARM_BASE}", local) if warm else (base, repo_id)
    argv = [f"vllm serve {model} --enable-lora --max-lora-rank {rank} --lora-modules {name}={adapter}"]
    if serving.get("max_model_len"):
        argv.append(f"--max-model-len {serving['max_model_len']}")
    if warm and serving.get("template"):
        argv.append(f"--chat-template {local}/chat_template.jinja")
    argv.append(" ".join(serve_flags(serving.get("template"), bool(serving.get("tools")))))
    command = " \\\n  ".join(a for a in argv if a)
    return [f"hf download {repo_id} --local-dir {local}", command] if warm else [command]


def request_lines(run: Mapping[str, Any], name: str, max_tokens: int) -> list[str]:
    """A chat request for the served adapter: with the run's tools (as training showed them) and one of its
    prompts, so the answer is a parsed tool call."""
    from agrpo.agents.sharing import example_messages

    serving = run.get("serving") or {}
    request: dict[str, Any] = {"model": name, "messages": example_messages(serving.get("example"))}
    if serving.get("tools"):
        request["tools"] = serving["tools"]
    request.update(max_tokens=max_tokens, temperature=0)
    body = json.dumps(request).replace("'", "'\\''")
    return [
        "curl http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\",
        f"  -d '{body}'",
    ]


def usage_section(run: Mapping[str, Any]) -> list[str]:
    repo_id, base = run["repo_id"], run["base_model"]
    name = lora_module_name(repo_id)
    config = run.get("config") or {}
    # the rank the run's replicas served (its config.yaml holds it resolved); a config without it: lora.r's capacity
    rank = _get(config, "inference.max_lora_rank") or round_lora_rank(int(_get(config, "lora.r", 8) or 8))
    warm = run.get("warm_base")
    lines = ["## Use it", ""]
    if warm:
        lines += [
            f"Two parts, both in this repo: the adapter (its root) and the model it was trained on (`{WARM_BASE}/`, "
            f"`{base}` after agrpo's warm start). Load the adapter on `{WARM_BASE}/`, not on `{base}` itself.",
            "",
        ]
    elif not run.get("base_model_on_hub"):
        lines += [f"The base model was a local folder (`{base}`): replace it below with where you keep that model.", ""]
    if _get(config, "model.chat_template"):
        lines += [
            f"Trained with the `{_get(config, 'model.chat_template')}` chat template, saved with the adapter "
            "(chat_template.jinja): give it to vLLM with `--chat-template` if the base model's own differs.",
            "",
        ]
    max_tokens = _get(config, "trainer.max_completion_length") or 256
    tools = (run.get("serving") or {}).get("tools")
    flags = serve_flags((run.get("serving") or {}).get("template"), bool(tools))
    lines += ["### vLLM (OpenAI-compatible server)", "", "```bash"]
    lines += serve_lines(run, rank, name) + request_lines(run, name, max_tokens) + ["```", ""]
    lines += [f"The adapter is served under the name `{name}`; requests for the base model's name get the base model."]
    if tools and flags:
        lines += [f"The request lists the run's tools as training showed them; `{flags[2]}` parses the calls."]
    elif tools:
        lines += ["No vLLM tool-call parser is known for this chat template: pick one (`--tool-call-parser`)."]
    lines += ["", *peft_lines(run, repo_id, base, max_tokens)]
    return lines


def peft_lines(run: Mapping[str, Any], repo_id: str, base: str, max_tokens: int) -> list[str]:
    load = f'"{repo_id}", subfolder="{WARM_BASE}"' if run.get("warm_base") else f'"{base}"'
    return [
        "### peft + transformers",
        "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"base = AutoModelForCausalLM.from_pretrained({load})",
        f'model = PeftModel.from_pretrained(base, "{repo_id}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")  # the chat template it was trained with',
        'messages = [{"role": "user", "content": "Hello!"}]',
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        "return_dict=True)",
        f"output = model.generate(**inputs, max_new_tokens={max_tokens})",
        'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
    ]


def build_card(run: Mapping[str, Any]) -> str:
    """The README.md of the adapter repo.

    `run`: repo_id, base_model, base_model_on_hub (bool), config (the resolved config as a dict), metrics
    (metrics.json or None), evals (eval_summary.json dicts, base model and/or adapter), curves (the picture's path in
    the repo, or None), command (how the run was started, or None).
    """
    base, repo_id = run["base_model"], run["repo_id"]
    base_link = f"[{base}](https://huggingface.co/{base})" if run.get("base_model_on_hub") else f"`{base}`"
    if run.get("warm_base"):
        base_link += f" (warm-started on its tools by agrpo: the model in `{WARM_BASE}/`)"
    intro = [
        f"# {lora_module_name(repo_id)}",
        "",
        f"A LoRA adapter of {base_link}, trained with GRPO by agrpo (TRL's "
        "AsyncGRPOTrainer: vLLM generates while the trainer learns, and only the adapter travels between them).",
        "",
    ]
    body = intro + training_section(run) + [""] + results_section(run) + usage_section(run)
    return front_matter(run) + "\n" + "\n".join(body).rstrip() + "\n"


def eval_labels(evals: Sequence[Mapping[str, Any]]) -> list[str]:
    """How each evaluation is named in the card's table."""
    return ["this adapter" if summary.get("adapter") else "base model" for summary in evals]
