"""Three runs on one shared fleet, isolated, the way users run them (issue 43's isolation acceptance):

    agrpo fleet up NAME +recipe=smoke                            (one vLLM boot: the only one of this file)
    python -m agrpo +recipe=smoke inference.shared_fleet=NAME    (runs A, B and C, at once)

While they train: another tenant's token (a fourth tenant the test registers through the API with the fleet's admin
token, read from the fleet's private record: tokens never appear on a command line, and a run's is only in its
trainer's environment) cannot load, unload or pause A's adapters, generate with them or renew A's lease (403 each).
Then A's trainer is SIGKILLed (its process group; A's launcher lives and unregisters it) and the whole of C, launcher
and trainer (nothing unregisters C but the lapse of its lease): B completes and its reward rises, A's and C's
adapters leave the replica's /v1/models within the documented bound (lease + 1 s + the unloads; docs/shared_fleet.md)
and nothing of A or C is left running. A run whose model differs from the fleet's exits 2 before any process starts;
`agrpo fleet status` lists the tenants; `agrpo fleet down` leaves nothing of the fleet. Only the SIGKILLs and the
fourth tenant are the test's; every answer and every cleanup is the product's.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.processes import Drained, RunProcesses, left_behind, trainer_pids, wait_for

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.timeout(1200),
]

SMALL = ["trainer.save_steps=0", "logger.console_every=5"]
B_STEPS = 40  # enough for the smoke reward to rise (about +0.3 in 60 steps alone)
A_STEPS = 400  # A is killed mid-run, long before this
LEASE_S = 20.0  # the fleet's default lease (inference.shared.lease_s)
UNLOAD_MARGIN_S = 10.0  # the unloads on a 2-core machine busy with B's training


def call(url: str, method: str, token: str | None, body: dict | None = None, timeout: float = 30.0):
    """(status, JSON body) of one request to the fleet's proxy."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    request = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw or b"{}")
        except ValueError:
            return error.code, {"text": raw.decode(errors="replace")}


def served_models(url: str) -> list[str]:
    """The replica's /v1/models as the proxy passes it on (open read; the fleet has one replica)."""
    status, body = call(f"{url}/v1/models", "GET", None)
    assert status == 200, body
    return [model["id"] for model in body.get("data", [])]


def run_argv(name: str, fleet: str, run_dir: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agrpo",
        "+recipe=smoke",
        f"inference.shared_fleet={fleet}",
        f"run_name={name}",
        f"trainer.max_steps={steps}",
        f"hydra.run.dir={run_dir}",
        *SMALL,
        *extra,
    ]


def start(argv: list[str], base: Path, env: dict, token: str) -> Drained:
    return Drained(argv, cwd=base, env={**env, "AGRPO_RUN_TOKEN": token}, start_new_session=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The whole scenario, once; the tests below assert on what it recorded."""
    base = tmp_path_factory.mktemp("shared_fleet")
    name = f"iso-{secrets.token_hex(3)}"
    tokens = {role: f"test-{secrets.token_hex(6)}" for role in ("fleet", "a", "b", "c", "other")}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    seen: dict = {"name": name, "base": base, "bound_s": LEASE_S + 1.0 + UNLOAD_MARGIN_S}
    fleet = start([sys.executable, "-m", "agrpo", "fleet", "up", name, "+recipe=smoke"], base, env, tokens["fleet"])
    runs: dict[str, Drained] = {}
    try:
        url, admin_token = fleet_ready(fleet, name, seen)
        other_model = [f"model.name_or_path={base / 'other-model'}", "model.builder=null"]
        other = start(run_argv("other", name, base / "other", 5, *other_model), base, env, tokens["other"])
        other.communicate(timeout=300)
        seen.update(
            other_code=other.returncode, other_output=other.output(), other_left=left_behind(tokens["other"], 5)
        )
        for role in ("a", "b", "c"):
            steps = B_STEPS if role == "b" else A_STEPS
            runs[role] = start(run_argv(f"shared-{role}", name, base / role, steps), base, env, tokens[role])
        watched = {role: RunProcesses(tokens[role]) for role in ("a", "c")}
        tenants = wait_for(lambda: all_serving(url, admin_token, runs), 900, "every run's adapters served")
        for processes in watched.values():
            processes.snapshot()  # their sessions, so that renamed children are found later
        seen.update(tenants=tenants, status=status_output(name, env))
        seen["refusals"] = another_tenants_rights(url, admin_token, tenants["shared-a"])
        seen["gone_after_s"] = kill_and_time(url, base, runs, tenants, seen["bound_s"] + 30)
        for role in ("a", "c"):
            runs[role].communicate(timeout=120)
            seen[f"{role}_code"], seen[f"{role}_left"] = runs[role].returncode, watched[role].left_behind(60)
        runs["b"].communicate(timeout=900)
        seen["b_code"], seen["b_output"] = runs["b"].returncode, runs["b"].output()
        seen["b_metrics"] = json.loads((base / "b" / "metrics.json").read_text())
        down = Drained([sys.executable, "-m", "agrpo", "fleet", "down", name], cwd=base, env=env)
        down.communicate(timeout=120)
        seen["down_code"], seen["down_output"] = down.returncode, down.output()
        fleet.communicate(timeout=120)
        seen["fleet_code"], seen["fleet_output"] = fleet.returncode, fleet.output()
        seen["fleet_left"] = left_behind(tokens["fleet"], 60)
    finally:
        for process in [*runs.values(), fleet]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return seen


def fleet_ready(fleet: Drained, name: str, seen: dict) -> tuple[str, str]:
    """(URL, admin token) once `agrpo fleet up` printed its ready line; the token from the fleet's private record."""
    from agrpo.fleet.registry import read_fleet

    ready = wait_for(
        lambda: re.search(rf"fleet {name} ready at (\S+)", fleet.output()[0]) or fleet.poll() is not None,
        600,
        "the fleet's ready line",
    )
    assert fleet.poll() is None, fleet.output()
    record = read_fleet(name)
    assert record.url == ready.group(1)
    seen["url"] = record.url
    return record.url, record.admin_token


def kill_and_time(url: str, base: Path, runs: dict, tenants: dict, timeout_s: float) -> dict[str, float]:
    """SIGKILL run A's trainer (its launcher lives on and unregisters it) and the whole of run C (launcher and
    trainer: only the lease can free its adapters); seconds until each one's adapters left the replica."""
    kill_trainer(base / "a")
    kill_trainer(base / "c")
    os.killpg(runs["c"].pid, signal.SIGKILL)
    killed = time.monotonic()
    prefixes = {role: f"{tenants[f'shared-{role}']}/" for role in ("a", "c")}
    gone: dict[str, float] = {}

    def all_gone() -> bool:
        models = served_models(url)
        for role, prefix in prefixes.items():
            if role not in gone and not any(m.startswith(prefix) for m in models):
                gone[role] = time.monotonic() - killed
        return len(gone) == len(prefixes)

    wait_for(all_gone, timeout_s, "the killed runs' adapters unloaded", poll_s=0.25)
    return gone


def all_serving(url: str, admin_token: str, runs: dict) -> dict[str, str] | None:
    """{run name: tenant id} once every run is registered and each has an adapter on the replica."""
    for role, run in runs.items():
        assert run.poll() is None, f"run {role} ended early (exit {run.returncode}): {run.output()}"
    status, body = call(f"{url}/fleet/tenants", "GET", admin_token)
    assert status == 200, body
    # each tenant's time at the fair-share gate, which an auto fleet counts as its starvation (agrpo/fleet/signals.py)
    assert all(isinstance(t.get("gate_wait_s"), (int, float)) and t["gate_wait_s"] >= 0 for t in body["tenants"]), body
    tenants = {t["run"]: t["tenant"] for t in body["tenants"]}
    if set(tenants) != {f"shared-{role}" for role in runs}:
        return None
    models = served_models(url)
    if all(any(m.startswith(f"{tenant}/trl-policy-v") for m in models) for tenant in tenants.values()):
        return tenants
    return None


def status_output(name: str, env: dict) -> tuple[int, str]:
    status = Drained([sys.executable, "-m", "agrpo", "fleet", "status", name], env=env)
    out, err = status.communicate(timeout=120)
    return status.returncode, out + err


def another_tenants_rights(url: str, admin_token: str, victim: str) -> dict:
    """A third tenant (registered as a run would be) tries to touch the victim's adapters; it is then unregistered."""
    status, registered = call(
        f"{url}/fleet/tenants", "POST", admin_token, {"run": "intruder", "lease_s": 60.0, "versions": 1, "lora_rank": 8}
    )
    assert status == 200, registered
    token, own = registered["token"], registered["tenant"]
    victims = [m for m in served_models(url) if m.startswith(f"{victim}/")]
    target = victims[-1]
    answers = {
        "load": call(f"{url}/v1/load_lora_adapter", "POST", token, {"lora_name": target, "lora_path": "/tmp/x"}),
        "unload": call(f"{url}/v1/unload_lora_adapter", "POST", token, {"lora_name": target}),
        "pause": call(f"{url}/pause", "POST", token),
        "generate": call(f"{url}/v1/completions", "POST", token, {"model": target, "prompt": "hi", "max_tokens": 2}),
        "renew_victims_lease": call(f"{url}/fleet/tenants/{victim}/lease", "POST", token),
    }
    answers["still_served"] = target in served_models(url)
    answers["own_unregistered"] = call(f"{url}/fleet/tenants/{own}", "DELETE", token)[0]
    answers["target"] = target
    return answers


def kill_trainer(run_dir: Path) -> int:
    """SIGKILL run A's trainer and its rollout child (the trainer leads its own process group)."""
    pids = wait_for(lambda: trainer_pids(run_dir), 60, "run A's trainer")
    os.killpg(os.getpgid(pids[0]), signal.SIGKILL)
    return pids[0]


def test_another_tenants_token_cannot_touch_a_runs_adapters(shared):
    refusals = shared["refusals"]
    for action in ("load", "unload", "pause", "generate", "renew_victims_lease"):
        status, body = refusals[action]
        assert status == 403, (action, status, body)
    assert "namespace" in json.dumps(refusals["unload"][1]) or "may" in json.dumps(refusals["unload"][1])
    assert "sync.mode=background" in json.dumps(refusals["pause"][1])
    assert refusals["still_served"], refusals  # the refused unload unloaded nothing
    assert refusals["own_unregistered"] == 200


def test_killed_runs_adapters_leave_within_the_bound_and_nothing_of_them_runs(shared):
    """A: its trainer SIGKILLed, its launcher unregisters it at once. C: launcher and trainer SIGKILLed together,
    nothing unregisters it but the lapse of its lease (bound: lease + 1 s + the unloads)."""
    gone = shared["gone_after_s"]
    assert gone["a"] <= shared["bound_s"] and gone["c"] <= shared["bound_s"], gone
    assert shared["a_code"] != 0  # A's launcher reports its dead trainer
    assert shared["a_left"] == {} and shared["c_left"] == {}, (shared["a_left"], shared["c_left"])


def test_the_other_run_completes_and_learns(shared):
    metrics = shared["b_metrics"]
    assert shared["b_code"] == 0, shared["b_output"][1][-3000:]
    assert metrics["global_step"] == B_STEPS
    assert metrics["reward_last"] > metrics["reward_first"] + 0.15, metrics
    section = metrics["shared_fleet"]
    assert section["fleet"] == shared["name"] and section["tenant"] == shared["tenants"]["shared-b"]
    assert section["tokens"] > 0 and 0 < section["share_of_fleet"] <= 1.0
    out = "".join(shared["b_output"])
    assert re.search(rf"fleet {shared['name']}: this run's share \d+% of \d+ replica-seconds \([\d,]+ tokens\)", out)


def test_a_run_of_another_model_exits_2_before_any_process_starts(shared):
    out = "".join(shared["other_output"])
    assert shared["other_code"] == 2, out[-3000:]
    assert f"the fleet {shared['name']} serves the model" in out, out[-3000:]
    assert shared["other_left"] == {}
    assert not (shared["base"] / "other" / "logs" / "trainer.log").exists()


def test_fleet_status_lists_the_tenants_and_down_leaves_nothing(shared):
    code, out = shared["status"]
    assert code == 0, out
    for tenant in shared["tenants"].values():
        assert tenant in out, out
    assert shared["down_code"] == 0, shared["down_output"]
    assert shared["fleet_left"] == {}, shared["fleet_left"]
    print(
        f"shared fleet: adapters gone {shared['gone_after_s']} s after the SIGKILLs (bound "
        f"{shared['bound_s']:.0f} s); B: reward {shared['b_metrics']['reward_first']:.2f} -> "
        f"{shared['b_metrics']['reward_last']:.2f}, {shared['b_metrics']['shared_fleet']}"
    )
