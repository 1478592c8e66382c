"""`python -m agrpo --help`: the command, the other subcommands, and every config group with its options and a
one-line description. Descriptions are the comments of conf/config.yaml's defaults list and options are the files
in each group's folder, so the help cannot drift from what composes."""

from __future__ import annotations

import re
from pathlib import Path

USAGE = """agrpo: asynchronous GRPO training of LoRA adapters on vLLM replicas, from one Hydra config.

python -m agrpo +recipe=NAME [group=option ...] [key=value ...]     (or the `agrpo` command)
  +recipe=smoke                    train the tiny offline model on CPU (~2 min)
  +recipe=./mine.yaml              your own recipe file (may build on one: defaults: [/recipe/smoke])
  launcher.dry_run=true            print the plan (processes or Jobs, files), start nothing
  inference.replicas=2             several vLLM replicas behind agrpo's proxy
  launcher=hf_jobs sync=bucket     run as Hugging Face Jobs (rehearsal.enabled=true: rehearse here)
  -m lora.r=1,8                    a sweep (Hydra multirun)
  --cfg job --resolve              print the composed config

Other commands:
  agrpo eval +recipe=NAME [eval.adapter=PATH]   score a base model or an adapter (docs/eval.md)
  agrpo plot RUN_DIR [RUN_DIR ...]              training curves as a PNG
  agrpo push RUN_DIR --repo-id NAME             upload the adapter with a model card to the Hub
  agrpo jobs status|logs|cancel RUN_ID          the HF Jobs of a run (status: what they cost so far)
  agrpo pull RUN_ID                             a Jobs run's folder into outputs/<run_name>/RUN_ID
  agrpo --version                               agrpo's version
"""

_DEFAULT = re.compile(r"^\s*-\s*(?P<group>[a-z_]+):\s*(?P<option>\S+)\s*#\s*(?P<why>.+)$")


def group_lines(config_text: str) -> list[tuple[str, str, str]]:
    """(group, default option, description) for each commented group of the defaults list."""
    found = []
    for line in config_text.splitlines():
        match = _DEFAULT.match(line)
        if match:
            found.append((match["group"], match["option"], match["why"].strip()))
    return found


def options(conf_dir: Path, group: str) -> list[str]:
    return sorted(path.stem for path in (conf_dir / group).glob("*.yaml"))


def help_text(conf_dir: Path) -> str:
    lines = [USAGE, "Config groups (group=option; the default first):"]
    groups = [
        ("recipe", "", "+recipe=NAME: an overlay of only what differs from the defaults (recipes/)"),
        *group_lines((conf_dir / "config.yaml").read_text()),
    ]
    for group, default, why in groups:
        names = options(conf_dir, group)
        ordered = ([default] if default in names else []) + [name for name in names if name != default]
        lines.append(f"  {group:<10} {why}")
        lines.append(f"  {'':<10}   {', '.join(ordered)}")
    lines += [
        "",
        "Every key and its default: agrpo/config/schema.py, or `python -m agrpo +recipe=smoke --cfg job`.",
        "Hydra's own help: --hydra-help. Docs: README.md and docs/.",
    ]
    return "\n".join(lines)
