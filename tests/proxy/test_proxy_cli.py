"""Settings, the command line, and the in-process thread helper."""

import json
import os
import socket
import subprocess
import sys
import time
import typing
from dataclasses import fields
from pathlib import Path

import pytest
import requests
from omegaconf import OmegaConf

from agrpo.proxy import ProxySettings, start_proxy_thread
from agrpo.proxy.cli import build_parser, settings_from_args
from tests.processes import Drained

REPO = Path(__file__).resolve().parents[2]


def test_settings_are_a_plain_structured_config():
    cfg = OmegaConf.structured(ProxySettings)
    assert cfg.block_size == 16 and cfg.port == 8000 and cfg.host == "127.0.0.1"
    assert cfg.upstreams == [] and cfg.token_env is None
    merged = OmegaConf.merge(cfg, {"upstreams": ["http://a:1"], "spill_factor": 2})
    settings = OmegaConf.to_object(merged)
    assert isinstance(settings, ProxySettings) and settings.upstreams == ["http://a:1"]
    allowed = {int, float, str, bool, typing.Optional[str], list[str]}
    hints = typing.get_type_hints(ProxySettings)
    assert all(hints[f.name] in allowed for f in fields(ProxySettings))
    assert all(f.metadata.get("help") for f in fields(ProxySettings))


def test_problems_name_the_flag_to_change():
    assert ProxySettings(upstreams=["http://127.0.0.1:1"]).problems() == []
    problems = " ".join(
        ProxySettings(upstreams=["ftp://x", "http://a:1", "http://a:1/"], block_size=0, health_quorum=5).problems()
    )
    for expected in ("ftp://x", "twice", "--block-size", "--health-quorum"):
        assert expected in problems
    assert "--upstream" in ProxySettings().problems()[0]


def test_one_flag_per_field_with_its_default_in_help():
    parser = build_parser()
    help_text = " ".join(parser.format_help().split())
    for f in fields(ProxySettings):
        flag = "--upstream" if f.name == "upstreams" else "--" + f.name.replace("_", "-")
        assert flag in help_text
    assert "(default: 16)" in help_text and "(default: 127.0.0.1)" in help_text
    settings = settings_from_args(
        [
            "--upstream",
            "http://a:1",
            "--upstream",
            "http://b:2",
            "--port",
            "9001",
            "--token-env",
            "HF_TOKEN",
            "--spill-factor",
            "2.5",
            "--no-use-uvloop",
        ]
    )
    assert settings.upstreams == ["http://a:1", "http://b:2"]
    assert (settings.port, settings.token_env, settings.spill_factor) == (9001, "HF_TOKEN", 2.5)
    assert settings.use_uvloop is False
    assert settings_from_args([]).block_size == 16


def cli(*args, env=None, timeout=30):
    return subprocess.run(
        [sys.executable, "-m", "agrpo.proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_cli_bad_arguments_give_one_paragraph_and_exit_non_zero():
    result = cli("--upstream", "nope", "--port", "70000")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot start" in result.stderr and "'nope'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli("--port", "abc")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    result = cli("--upstream", "http://127.0.0.1:1", "--token-env", "AGRPO_UNSET_VARIABLE")
    assert result.returncode == 2 and "AGRPO_UNSET_VARIABLE" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_refuses_unsafe_replica_urls_and_an_empty_admin_token():
    result = cli("--upstream", "http://user:secret@127.0.0.1:1", "--upstream", "http://h:2/x?y")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "credentials" in result.stderr and "path, query" in result.stderr
    assert "secret" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli("--upstream", "http://127.0.0.1:1", "--admin-token-env", "AGRPO_UNSET_ADMIN")
    assert result.returncode == 2 and "AGRPO_UNSET_ADMIN" in result.stderr
    assert "Traceback" not in result.stderr
    # hosts no resolver takes, port 0, and one server under two spellings: refused at start, exit 2, one paragraph
    for bad in ("http://..:8000", "http://127.0.0.1:0", "http://[127.0.0.1]:1"):
        result = cli("--upstream", bad)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert bad in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = cli("--upstream", "http://127.0.0.1:9", "--upstream", "HTTP://0x7f.1:9")
    assert result.returncode == 2 and "given twice" in result.stderr


def test_cli_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("--upstream", "http://127.0.0.1:1", "--port", str(port))
    assert result.returncode == 1
    assert "already in use" in result.stderr and "Traceback" not in result.stderr


def test_cli_serves_until_terminated(tmp_path, held_port):
    port = held_port
    process = Drained(
        [
            sys.executable,
            "-m",
            "agrpo.proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--port",
            str(port),
            "--health-interval-s",
            "60",
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = requests.get(f"http://127.0.0.1:{port}/proxy/stats", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        stats = response.json()
        assert stats["routed"] == 0 and stats["replicas"][0]["healthy"] is False
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 503
    finally:
        process.terminate()
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0
    assert f"listening on http://127.0.0.1:{port}" in out


def test_thread_helper_runs_a_proxy_and_raises_startup_errors():
    handle = start_proxy_thread(ProxySettings(upstreams=["http://127.0.0.1:1"], port=0, health_interval_s=60))
    try:
        stats = requests.get(handle.url + "/proxy/stats", timeout=5).json()
        assert stats["replicas"][0]["url"] == "http://127.0.0.1:1"
        answer = requests.post(handle.url + "/v1/completions", json={"model": "m", "prompt": [1]}, timeout=10)
        assert answer.status_code == 502 and "error" in answer.json()
        port = int(handle.url.rsplit(":", 1)[1])
        with pytest.raises(OSError):
            start_proxy_thread(ProxySettings(upstreams=["http://127.0.0.1:1"], port=port))
    finally:
        handle.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(handle.url + "/health", timeout=2)
    with pytest.raises(ValueError, match="--upstream"):
        start_proxy_thread(ProxySettings())


def test_stats_json_has_the_contract_fields():
    handle = start_proxy_thread(ProxySettings(upstreams=["http://127.0.0.1:1"], port=0))
    try:
        stats = requests.get(handle.url + "/proxy/stats", timeout=5).json()
    finally:
        handle.stop()
    for key in ("routed", "affinity", "spilled", "unmatched"):
        assert isinstance(stats[key], int)
    replica = stats["replicas"][0]
    assert {"url": str, "healthy": bool, "inflight": int, "routed": int} == {
        k: type(replica[k]) for k in ("url", "healthy", "inflight", "routed")
    }
    json.dumps(stats)
