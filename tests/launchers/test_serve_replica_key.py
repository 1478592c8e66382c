"""launchers/serve_replica.py refuses a replica key shorter than 32 characters when the replica listens beyond loopback
(issue 42, item 5: it accepted a one-character key with --host 0.0.0.0): one paragraph, exit 2. The script runs for
real, as a user runs it, with launcher.dry_run=true (it prints the replica's command instead of starting vLLM)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launchers" / "serve_replica.py"
LONG_KEY = "k" * 32


def serve_replica_module():
    spec = importlib.util.spec_from_file_location("serve_replica", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("host", "addresses", "beyond"),
    [
        ("0.0.0.0", ["0.0.0.0"], True),
        ("::", ["::"], True),
        ("[::]", [], True),
        ("10.1.2.3", ["10.1.2.3"], True),
        ("node-b", ["10.1.2.3"], True),
        ("node-b", [], True),  # unresolvable here: meant for others
        ("node-b", ["127.0.1.1", "10.1.2.3"], True),
        ("127.0.0.1", ["127.0.0.1"], False),
        ("127.0.0.2", [], False),
        ("::1", ["::1"], False),
        ("[::1]", [], False),
        ("localhost", ["127.0.0.1", "::1"], False),
    ],
)
def test_beyond_loopback(host, addresses, beyond):
    assert serve_replica_module().beyond_loopback(host, addresses) is beyond


def test_exposed_key_problem_counts_the_stripped_key():
    serve = serve_replica_module()
    assert serve.MIN_EXPOSED_KEY == 32
    assert serve.exposed_key_problem(LONG_KEY, "0.0.0.0", ["0.0.0.0"]) is None
    assert serve.exposed_key_problem("x", "127.0.0.1", ["127.0.0.1"]) is None  # reachable from this machine only
    problem = serve.exposed_key_problem(f"  {'k' * 31}\n", "0.0.0.0", ["0.0.0.0"])
    assert problem.startswith("AGRPO_REPLICA_API_KEY is 31 characters, and --host 0.0.0.0 listens beyond")
    assert "at least 32 characters" in problem and "secrets.token_urlsafe(32)" in problem and "\n" not in problem


def serve(tmp_path: Path, key: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "AGRPO_REPLICA_API_KEY": key,
    }
    argv = [sys.executable, str(SCRIPT), *args, "+recipe=gsm8k", "launcher.dry_run=true"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_one_character_key_on_all_addresses_is_refused_in_one_paragraph(tmp_path):
    done = serve(tmp_path, "x", "--host", "0.0.0.0")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve_replica: error: AGRPO_REPLICA_API_KEY is 1 characters")
    assert "x" * 2 not in lines[0]  # the key itself is never shown


def test_a_long_key_on_all_addresses_and_a_short_one_on_loopback_start(tmp_path):
    exposed = serve(tmp_path, LONG_KEY, "--host", "0.0.0.0")
    assert exposed.returncode == 0, exposed.stderr[-2000:]
    assert "--host 0.0.0.0" in exposed.stdout and "VLLM_API_KEY=<set>" in exposed.stdout
    assert LONG_KEY not in exposed.stdout + exposed.stderr
    local = serve(tmp_path, "x", "--host", "127.0.0.1")
    assert local.returncode == 0 and "--host 127.0.0.1" in local.stdout, local.stderr[-2000:]
