"""The home of the schema's composable copies (agrpo/config/schema/knobs.py's `composable`): pickle finds a composed
config's classes here by their qualified name, and a process that composed nothing yet (unpickling a config shipped
to a sweep worker) builds them on first request. Kept out of knobs.py, which the schema's modules import: building
the copies needs the whole schema (RunConfig), so a lookup there would close a file-level import cycle."""

from __future__ import annotations

from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.config.schema.knobs import COMPOSED, composable


def __getattr__(name: str) -> Any:
    """A composable class asked for before this process built it."""
    if name.startswith("Composable"):
        composable(RunConfig)
        if name in COMPOSED:
            return COMPOSED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
