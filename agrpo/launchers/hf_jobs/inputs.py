"""This machine's model folder, data file and chat template, carried to the Jobs through the bucket.

A Job sees only its image and the bucket mount, so a model built here (`model.builder`: the smoke recipe's tiny
model), a local fine-tune, a local JSONL or a `.jinja` template would be missing inside it. The planner lists each
such input (`local_inputs`, reading only whether the paths exist) and points the Jobs' config at its copy under the
run's folder on the bucket (`config_for_jobs`); the executor builds and uploads them (`upload_pairs`) before any Job
starts. Inputs already under `sync.mount_path`, and Hub ids, stay as they are.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from agrpo.config.hf_jobs_checks import under_mount
from agrpo.config.schema import RunConfig
from agrpo.config.spec import select, with_values
from agrpo.errors import ConfigError
from agrpo.launchers.hf_jobs.code_inputs import code_inputs
from agrpo.launchers.hf_jobs.plan import LocalInput
from agrpo.launchers.plan import ModelStep
from agrpo.models.resolve import looks_like_path

INPUTS_DIR = "inputs"  # under the run's folder on the bucket


def local_model(cfg: RunConfig) -> tuple[str, str | None, str | None] | None:
    """(folder here, builder, its input) when the model lives or is built on this machine; None for a Hub id or the
    bucket."""
    name, builder = str(cfg.model.name_or_path), cfg.model.builder or None
    path = os.path.expanduser(name)
    if under_mount(path, cfg.sync.mount_path) and not builder:
        return None
    if builder or os.path.isdir(path):
        return os.path.abspath(path), builder, cfg.model.builder_input if builder else None
    if looks_like_path(name):
        raise ConfigError(
            f"model.name_or_path={name!r} is not a folder on this machine, so it cannot be uploaded for the Jobs: "
            "point it at a model folder here, a folder under sync.mount_path, or a Hub model id"
        )
    return None


def local_file(cfg: RunConfig, key: str) -> str | None:
    """The local file or folder at `key` when the Jobs cannot see it; None when unset or already on the bucket."""
    value = select(cfg, key)
    if not value:
        return None
    value = str(value)
    path = os.path.expanduser(value)
    if under_mount(path, cfg.sync.mount_path):
        return None
    if key == "model.chat_template" and not (value.endswith(".jinja") or looks_like_path(value)):
        return None  # a TRL template name, not a file
    if not os.path.exists(path):
        raise ConfigError(
            f"{key}={value!r} does not exist on this machine, so it cannot be uploaded for the Jobs: point it at "
            "an existing file, or at one under sync.mount_path"
        )
    return os.path.abspath(path)


def local_inputs(cfg: RunConfig, run_dir: str, run_dir_in_bucket: str) -> list[LocalInput]:
    """What the Jobs need from this machine, each with its place in the run's folder on the bucket."""

    def placed(key: str, source: str, name: str, builder: str | None = None) -> LocalInput:
        where = f"{INPUTS_DIR}/{name}"
        return LocalInput(key, source, f"{run_dir_in_bucket}/{where}", f"{run_dir}/{where}", builder)

    inputs = []
    model = local_model(cfg)
    if model:
        inputs.append(replace(placed("model.name_or_path", model[0], "model", model[1]), builder_input=model[2]))
    for key, folder in (("data.path", "data"), ("model.chat_template", "chat_template")):
        source = local_file(cfg, key)
        if source:
            inputs.append(placed(key, source, f"{folder}/{os.path.basename(source.rstrip('/'))}"))
    return inputs + code_inputs(cfg, placed)  # tool, environment and reward files here (code_inputs.py)


def config_for_jobs(cfg: RunConfig, inputs: list[LocalInput]) -> RunConfig:
    """`cfg` with every local input replaced by its copy on the bucket mount (and no builder: it is built)."""
    moved = {item.key: item.job_path for item in inputs}
    if any(item.builder for item in inputs):
        moved["model.builder"] = moved["model.builder_input"] = None
    return with_values(cfg, moved)


def upload_pairs(item: LocalInput) -> list[tuple[str, str]]:
    """(local file, destination in the bucket) for every file of the input, after building it when it has a
    builder (I/O: the executor calls this just before the upload)."""
    if item.builder:
        from agrpo.models.resolve import prepare_model

        prepare_model(ModelStep(item.source, item.builder, item.builder_input))
    source = Path(item.source)
    if source.is_file():
        return [(str(source), item.path_in_bucket)]
    files = sorted(p for p in source.rglob("*") if p.is_file())
    if not files:
        raise ConfigError(f"{item.key}={item.source!r} is an empty folder: nothing to upload for the Jobs")
    return [(str(p), f"{item.path_in_bucket}/{p.relative_to(source).as_posix()}") for p in files]
