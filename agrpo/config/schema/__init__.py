"""Structured config: every knob of a run, its default and why it exists. The YAML under conf/ only picks values.

Grouped as the config groups are: model, lora, data, reward, agent, trainer, inference, sync, launcher, logger
(+ proxy, eval), one module per few groups; every name is re-exported here. Each field is a `knob` whose
doc is field metadata (agrpo/config/schema/knobs.py), read by `--help` and docs/config.md; a value that is one of a
fixed set of names is an Enum (agrpo/config/schema/choices.py).
Hydra composes the YAML on top of these dataclasses in struct mode, so an unknown key is an error, not a silent no-op.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from agrpo.config.schema.choices import (
    Attention,
    Choice,
    Device,
    LogLevel,
    MixedPrecision,
    ModelDtype,
    Role,
    ServedDtype,
    SyncMode,
    TrainerLauncher,
)
from agrpo.config.schema.inference import FleetConfig, InferenceConfig, SyncConfig
from agrpo.config.schema.knobs import Knob, choice_fields, composable, knob, walk
from agrpo.config.schema.launcher import AccelerateConfig, HFJobsConfig, LauncherConfig
from agrpo.config.schema.model import (
    ALL_LINEAR,
    AgentConfig,
    DataConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    WarmstartConfig,
)
from agrpo.config.schema.run import EvalConfig, LoggerConfig, RunConfig
from agrpo.config.schema.trainer import TrainerConfig
from agrpo.proxy.settings import ProxySettings

__all__ = [
    "ALL_LINEAR",
    "AccelerateConfig",
    "AgentConfig",
    "Attention",
    "Choice",
    "DataConfig",
    "Device",
    "EvalConfig",
    "FleetConfig",
    "HFJobsConfig",
    "InferenceConfig",
    "Knob",
    "LauncherConfig",
    "LogLevel",
    "LoggerConfig",
    "LoraConfig",
    "MixedPrecision",
    "ModelConfig",
    "ModelDtype",
    "ProxySettings",
    "RewardConfig",
    "Role",
    "RunConfig",
    "ServedDtype",
    "SyncConfig",
    "SyncMode",
    "TrainerConfig",
    "TrainerLauncher",
    "WarmstartConfig",
    "choice_fields",
    "composable",
    "knob",
    "register_configs",
    "walk",
]


def register_configs() -> None:
    """Register the schema so conf/config.yaml can use it as its base (`- agrpo_schema` in its defaults). Hydra
    composes on its composable copy (choice fields as text), so a bad name reaches the validation pass."""
    store = ConfigStore.instance()
    store.store(name="agrpo_schema", node=composable(RunConfig))
