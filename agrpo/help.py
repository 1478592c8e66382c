"""`python -m agrpo --help`: the command, the other subcommands, and every config group with its options and a
one-line description. Descriptions are the comments of conf/config.yaml's defaults list and options are the files
in each group's folder, so the help cannot drift from what composes. `python -m agrpo --help GROUP` (or KEY) prints
those keys with their defaults, choices and why, read from the schema's field docs (agrpo/config/schema/knobs.py)."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

USAGE = """agrpo: asynchronous GRPO training of LoRA adapters on vLLM replicas, from one Hydra config.

python -m agrpo +recipe=NAME [group=option ...] [key=value ...]     (or the `agrpo` command)
  +recipe=smoke                    train the tiny offline model on CPU (~2 min)
  +recipe=./mine.yaml              your own recipe file (may build on one: defaults: [/recipe/smoke])
  launcher.dry_run=true            print the plan (processes or Jobs, files), start nothing
  inference.replicas=2             several vLLM replicas behind agrpo's proxy
  inference.replicas=auto          a fleet that grows and shrinks between inference.min_replicas and max_replicas
  launcher=hf_jobs sync=bucket     run as Hugging Face Jobs (add --rehearse: rehearse it all here first)
  -m lora.r=1,8                    a sweep (Hydra multirun)
  --cfg job --resolve              print the composed config

Other commands:
  agrpo eval +recipe=NAME [eval.adapter=PATH]   score a base model or an adapter (docs/eval.md)
  agrpo plot RUN_DIR [RUN_DIR ...]              training curves as a PNG
  agrpo push RUN_DIR --repo-id NAME             upload the adapter with a model card to the Hub
  agrpo jobs status|logs|cancel RUN_ID          the HF Jobs of a run (status: what they cost so far)
  agrpo pull RUN_ID                             a Jobs run's folder into outputs/<run_name>/RUN_ID
  agrpo fleet up|status|down [NAME]             a fleet of replicas several runs share (docs/shared_fleet.md)
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
    lines += ["", "Keys by group (`python -m agrpo --help GROUP` prints a group's keys, defaults, choices and why):"]
    lines += [f"  {prefix.rstrip('.'):<20} {first_sentence(schema.__doc__)}" for prefix, schema in key_groups()]
    lines += [
        "",
        "Every key, its default and why: docs/config.md; a composed config: `python -m agrpo +recipe=smoke --cfg job`.",
        "Hydra's own help: --hydra-help. Docs: README.md and docs/.",
    ]
    return "\n".join(lines)


def first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split()).split(". ")[0].rstrip(".")
    return textwrap.shorten(text, 96, placeholder=" ...")


def key_groups() -> list[tuple[str, type]]:
    """(dotted prefix, class) of every nested group of the schema, the top level left out."""
    from agrpo.config.schema import RunConfig
    from agrpo.config.schema.knobs import groups

    return [(prefix, schema) for prefix, schema in groups(RunConfig) if prefix]


def topics_of(argv: list[str]) -> list[str]:
    """The GROUP / KEY words after --help (not overrides, options or recipe selections)."""
    return [arg for arg in argv if not arg.startswith(("-", "+", "~")) and "=" not in arg]


def keys_text(topics: list[str]) -> tuple[str, int]:
    """Each key under the topics (a group such as `trainer` or `launcher.hf_jobs`, or one key), with its default,
    choices and doc; exit code 2 with the groups listed when a topic names nothing."""
    from agrpo.config.reference import knob_line
    from agrpo.config.schema import RunConfig, walk

    knobs = list(walk(RunConfig))
    lines: list[str] = []
    for topic in topics:
        found = [knob for knob in knobs if knob.key == topic or knob.key.startswith(f"{topic}.")]
        if not found:
            names = ", ".join(prefix.rstrip(".") for prefix, _ in key_groups())
            return f"agrpo: no config key or group named {topic!r}; the groups: {names}", 2
        for knob in found:
            lines.append(knob_line(knob))
            lines += textwrap.wrap(knob.doc, width=112, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines), 0


def main_help(conf_dir: Path, argv: list[str]) -> int:
    """What `python -m agrpo --help [GROUP|KEY ...]` prints; returns the exit code."""
    topics = topics_of(argv)
    text, code = keys_text(topics) if topics else (help_text(conf_dir), 0)
    print(text, file=sys.stderr if code else sys.stdout)
    return code
