"""The run configuration: typed schema (the only place defaults live) and cross-field validation."""

from agrpo.config.schema import RunConfig, register_configs

__all__ = ["RunConfig", "register_configs"]
