"""The model's config.json for the GPU memory check, fetched when this machine does not have it (issue 45).

The check used to read only a config.json already on the machine (a folder or the Hub cache), so the first run of a
recipe started unchecked and the identical rerun, its cache now warm, was refused. Now, where the Hub is reachable,
the small config.json (a few KB) is fetched into the Hub cache at prepare; where it is not (HF_HUB_OFFLINE=1, no
network, a private repo without a token), the check is skipped and the reason is returned for one log line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FETCH_TIMEOUT_S = 10.0


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def model_config_for_check(name_or_path: str) -> tuple[dict[str, Any] | None, str]:
    """(config.json as a dict, "") or (None, why the memory check is skipped). Local first, then the Hub."""
    from agrpo.config.vllm_checks import local_model_config

    found = local_model_config(name_or_path)
    if found is not None:
        return found, ""
    name = str(name_or_path)
    if Path(name).expanduser().exists() or not looks_like_repo_id(name):
        return None, f"{name} has no config.json yet (a model agrpo builds or converts at start-up)"
    if hub_offline():
        return None, f"{name}'s config.json is not in the Hub cache and HF_HUB_OFFLINE=1"
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(name, "config.json", etag_timeout=FETCH_TIMEOUT_S)
        config = json.loads(Path(path).read_text())
    except Exception as error:  # no network, gated or missing repo: say so, do not fail the run on it
        return None, f"{name}'s config.json could not be fetched ({type(error).__name__}: {str(error)[:160]})"
    return (config.get("text_config", config), "") if isinstance(config, dict) else (None, "config.json is not a dict")
