"""The typed run spec for tests of the code downstream of `prepare` (launchers, trainer, eval, inference).

`spec_for(overrides)` is what `prepare` returns for them, less the checks of this machine (the builders under test
take a spec, not a machine): composed as the CLI composes, validated by the pure checks, resolved with prepare's own
machine facts unless `cuda` says otherwise. A test changes a value with `with_values`, as the code does.
"""

from __future__ import annotations

from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.config.schema import RunConfig
from agrpo.config.spec import with_values  # noqa: F401 (tests import it from here)


def spec_for(*overrides: str, output_dir: str | None = None, cuda: bool | None = None, **prepare_args) -> RunConfig:
    composed = compose_run_config(list(overrides), output_dir=output_dir)
    return prepare(composed, check_environment=False, cuda_available=cuda, **prepare_args)
