"""Tool, environment and reward code that only this machine has, carried to a Jobs run like its data file.

A trainer Job sees its image, agrpo's wheel and the bucket. A `_target_` naming a file here (`my_tools.py:search`) or
a module in the working directory (`my_tools.search`, with my_tools.py there) would not import inside it. Each such
file is listed as a local input (agrpo/launchers/hf_jobs/inputs.py uploads it into the run's folder before any Job
starts, and the dry run prints it), and the Jobs' config names its copy as `file.py:name`. Tools and environments run
in the trainer Job's rollout worker; the replicas never need them. A file travels alone: helpers it imports from
beside it must be in the same file or in an installed package.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agrpo.config.hf_jobs_checks import under_mount
from agrpo.config.schema import RunConfig
from agrpo.config.spec import as_dict
from agrpo.errors import ConfigError

CODE_DIR = "code"  # under the run's inputs folder


def code_targets(cfg: RunConfig) -> Iterator[tuple[str, str]]:
    """(config key holding a `_target_`, the target) for every tool, environment factory and reward term."""
    agent = as_dict(cfg.agent)
    for index, entry in enumerate(agent.get("tools") or []):
        if isinstance(entry, dict):  # the mapping form, with options bound: its `_target_` is the code
            yield f"agent.tools.{index}._target_", entry.get("_target_")
        else:
            yield f"agent.tools.{index}", entry
    environment = agent.get("environment")
    if isinstance(environment, dict) and "_target_" in environment:
        yield "agent.environment._target_", environment["_target_"]
    elif isinstance(environment, dict):
        for name, entry in environment.items():
            yield f"agent.environment.{name}._target_", entry.get("_target_") if isinstance(entry, dict) else entry
    for index, term in enumerate(cfg.reward.funcs):
        if isinstance(term, dict):
            yield f"reward.funcs.{index}._target_", term.get("_target_")


def local_code(key: str, target: Any, cwd: Path) -> tuple[Path, str] | None:
    """(file here, name in it) when `target`'s code is a file on this machine; None for installed code."""
    if not isinstance(target, str) or not target:
        return None
    if ":" in target:
        path, _, name = target.rpartition(":")
        return Path(path).expanduser().resolve(), name
    top, _, rest = target.partition(".")
    if top == "agrpo":  # the Job installs agrpo's wheel (from this checkout, when launched from one)
        return None
    if (cwd / top / "__init__.py").is_file():
        raise ConfigError(
            f"{key}={target!r} is a package in the working directory, which a Job cannot import: install it in the "
            f"trainer image (launcher.hf_jobs.trainer_image) or name one file, e.g. {top}/module.py:function"
        )
    module = cwd / f"{top}.py"
    if module.is_file() and rest and "." not in rest:
        return module.resolve(), rest
    return None


def code_inputs(cfg: RunConfig, placed: Callable[[str, str, str], Any]) -> list[Any]:
    """The LocalInputs for every code file here, built with `placed(key, source, name)` (agrpo's inputs.py), each
    with the Jobs' value `<copy on the bucket>:<name>`."""
    inputs = []
    for key, target in code_targets(cfg):
        found = local_code(key, target, Path.cwd())
        if found is None or under_mount(str(found[0]), cfg.sync.mount_path):
            continue
        source, name = found
        folder = hashlib.sha256(str(source.parent).encode()).hexdigest()[:8]  # two my_tools.py never collide
        item = placed(key, str(source), f"{CODE_DIR}/{folder}/{source.name}")
        inputs.append(dataclasses.replace(item, job_path=f"{item.job_path}:{name}"))
    return inputs
