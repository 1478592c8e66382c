"""A fleet that sizes itself, the way a user runs it: `python -m agrpo +recipe=smoke inference.replicas=auto
inference.min_replicas=1 inference.max_replicas=2`, under the DEFAULT policy (inference.fleet.*: the schema's). The
launcher starts one replica; once training has started the test holds that replica to a quarter of a core (a cgroup
CPU quota on its whole process group, tests/cpu_quota.py), so the trainer waits for rollouts most of each step
(72-82%, against add_wait_share 5%). The fleet controller must see it, start the second replica on its own, hand it
to the proxy once healthy (adapters replayed), and keep it (steps/s up by more than min_gain). Then the test frees
the replica and holds the trainer's own process to a twentieth of a core instead (not its rollout and reward
children: generation stays fast), so the two replicas idle: the fleet must give one back, drained, and keep that
release. The run must complete, learn, log the fleet's size and replica-seconds, and leave nothing running. The slow
replica, the slow trainer and the run's `trainer.max_staleness=2` are the test's; every decision is the product's.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys

import pytest

from tests.cpu_quota import cpu_quota_unavailable
from tests.gpu_count import needs_gpus
from tests.processes import left_behind, read, trainer_pids, wait_for
from tests.tensorboard_tags import tensorboard_tags

pytestmark = [
    needs_gpus(3),  # up to two replicas and the trainer, each on its own GPU where there are GPUs
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.timeout(1800),
    pytest.mark.requires(cpu_quota_unavailable()),  # no root / cgroup cpu controller: fail saying so, never skip
]

AUTO = ["inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2"]
# The scenario, not the policy, makes each default decision unambiguous on a noisy 2-core machine:
# - trainer.max_staleness=2 lets the rollout worker run two versions ahead (benchmarks/elastic.py's runs): with the
#   smoke recipe's 1, the trainer held to a tenth of a core still waited 3-9% of its latest 20 steps of 0.4-0.7 s in
#   a fresh-clone CI run (one 1-2 s generation hiccup under the other lane's load), never the default 2%;
# - the trainer held to a twentieth of a core (TRAINER_SHARE) makes each step 1.6-2.5 s, so that slack is seconds
#   of samples ahead. Measured (docs/elastic.md): starved 60% (add at 5%), kept at steps/s 1.35 -> 2.11 (5% needed);
#   after the switch the trainer waited 0.2 s of its 31 s over steps 42-57 (0.6%; release at 2%).
# - every inference.fleet.* knob is the default (add at 5%, release at 2%). Until issue 47 the release was asserted
#   at release_wait_share=0.15 (add 0.25): a full `make test` (2026-12-07) showed the in-flight budget cut to one
#   batch (32 -> 16 samples, on the straggler phase's stale drops) and kept there, the slowed trainer waiting 6-12% of
#   every step, which the in-flight controller (then content below 10%) called fed and the fleet (2%) still waiting.
#   The controller now grows the budget until the trainer waits less than the fleet's release share
#   (agrpo/trainer/rollout/inflight.py MAX_WAIT_SHARE; docs/elastic.md, "Resolved conflict").
SCENARIO = ["trainer.max_staleness=2"]
# The spare is a standby (inference.fleet.standby): it served 4-12 s after the addition (step ~10-20) and was kept at
# step ~24-29, where the test switches; the release needs the default 30 s cool-down and inference.fleet.recent_steps
# (20) quiet steps after that, then its own judgement: kept at step ~52 and ~57 in two runs. The run must end soon
# after: with one replica left, the in-flight budget the straggler phase cut to 17 samples (32 -> 17 on its stale
# drops) left the trainer waiting ~0.2 s of each 2 s step from step 62 in one run, which the defaults read as
# generation-bound (5%): an addition at step ~75 (a third boot), undone. 70 steps end before that (and well before
# the reward collapse one 130-step run had at step ~115).
STEPS = 70
TRAINER_SHARE = 0.05  # of a core, for the trainer's own process once the addition was kept
VERDICT = re.compile(
    r"agrpo fleet: 2 replica\(s\): kept the add|agrpo fleet: 2 -> 1 replicas \(vllm-1 draining\): undo the add, it did "
    r"not help"
)  # either ends the first phase; the tests below assert that it was kept
RELEASED = "agrpo fleet: 1 replica(s) serving: vllm-1 drained after"  # then parked until the release is judged


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory):
    from tests.cpu_quota import cpu_quota, process_group

    run_dir = tmp_path_factory.mktemp("elastic") / "run"
    output = run_dir.parent / "launcher.out"
    token = f"test-{secrets.token_hex(6)}"
    argv = [
        sys.executable,
        "-m",
        "agrpo",
        "+recipe=smoke",
        *AUTO,
        *SCENARIO,
        f"trainer.max_steps={STEPS}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AGRPO_RUN_TOKEN": token}
    with open(output, "wb") as sink:
        launcher = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        replica_log = run_dir / "logs" / "vllm-0.log"
        wait_for(lambda: (run_dir / "fleet" / "steps.jsonl").exists(), 900, "the first training step")
        pid = int(re.search(r"\(APIServer pid=(\d+)\)", read(replica_log)).group(1))
        ended = lambda: launcher.poll() is not None  # noqa: E731
        with cpu_quota(process_group(os.getpgid(pid)), share=0.25, name=f"elastic-{os.getpid()}"):
            wait_for(lambda: VERDICT.search(read(output)) or ended(), 1200, "the added replica's verdict")
        sockets = standby_engine_sockets(run_dir / "logs" / "vllm-1.log")
        if "kept the add" in read(output) and not ended():  # else test_the_addition_was_judged_and_kept fails
            trainer = trainer_pids(run_dir)
            with cpu_quota(trainer, share=TRAINER_SHARE, name=f"elastic-trainer-{os.getpid()}"):
                wait_for(lambda: RELEASED in read(output) or ended(), 1200, "the idle replica's release")
                launcher.wait(timeout=1200)  # held to the end: a free trainer would want the replica back
        code = launcher.wait(timeout=1500)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert code == 0, read(output)[-5000:]
    return {"run_dir": run_dir, "output": read(output), "left": left_behind(token), "engine_sockets": sockets}


def standby_engine_sockets(replica_log) -> dict | None:
    """The ports the standby-started replica's API server listens on while it serves, its children (the engine core),
    and the listening ports they hold (issue 42: a forked engine core kept the API server's listening socket, so the
    port stayed open after the server died); None: its API server not found in the log."""
    from tests.inference.engine_sockets import children, listeners_held_by_children, listening_ports_of

    found = re.findall(r"\(APIServer pid=(\d+)\)", read(replica_log)) if replica_log.exists() else []
    if not found:
        return None
    server = int(found[-1])
    return {
        "server_ports": listening_ports_of(server),
        "children": children(server),
        "held": listeners_held_by_children(server),
    }


def test_the_standby_started_engine_core_holds_no_listening_socket(elastic_run):
    """Not the API server's port: the engine core may listen on ports of its own (vLLM's internal sockets)."""
    sockets = elastic_run["engine_sockets"]
    assert sockets is not None and sockets["server_ports"] and sockets["children"], sockets
    held = {port for ports in sockets["held"].values() for port in ports}
    assert not held & sockets["server_ports"], sockets


def test_it_grew_to_two_on_its_own_and_said_why(elastic_run):
    output = elastic_run["output"]
    assert "[fleet] auto: 1..2 replicas; starts 1" in output  # the plan the launcher printed
    grew = re.search(
        r"agrpo fleet: 1 -> 2 replicas \(vllm-1 starting from its standby\): (?:starved after \d+ steps: )?"
        r"generation-bound: the "
        r"trainer waited (\d+)%",
        output,
    )
    assert grew, output[-3000:]
    assert int(grew.group(1)) >= 25
    assert re.search(r"agrpo fleet: 2 replica\(s\) serving: vllm-1 admitted after \d+ s", output), output[-3000:]
    end = re.search(r"agrpo fleet: (\d+) replica-seconds \(1 replica\(s\) (\d+) s, 2 replica\(s\) (\d+) s", output)
    assert end, output[-3000:]
    assert int(end.group(1)) > 0 and int(end.group(3)) > 0


def test_the_spare_stood_by_and_served_once_added(elastic_run):
    """inference.fleet.standby: the spare imported vLLM when the run began and waited, holding no device; the
    addition only told it to serve. Once its release was kept and it stopped, it stood by again (the second standby
    was stopped at the end: test_nothing_left_running)."""
    output, run_dir = elastic_run["output"], elastic_run["run_dir"]
    assert output.index("agrpo fleet: vllm-1 standing by (it imports vLLM now") < output.index("1 -> 2 replicas"), (
        output[-3000:]
    )
    log = read(run_dir / "logs" / "vllm-1.log")
    waited, added = log.find("agrpo standby: vllm.entrypoints.openai.api_server imported in"), log.find("added; the")
    assert 0 <= waited < added < log.index("Starting vLLM server"), log[:3000]
    assert "the release was kept" in output, output[-3000:]
    assert log.count("holding no device") == 2 and log.rindex("holding no device") > log.index("Starting vLLM")


def test_the_policy_was_the_default_one(elastic_run):
    """The plan line names every knob: the run decided with the schema's defaults."""
    from agrpo.config.schema.inference import FleetConfig

    defaults = FleetConfig()
    plan = re.search(r"\[fleet\] auto: 1\.\.2 replicas; .*\((window_steps=.*)\)", elastic_run["output"])
    assert plan, elastic_run["output"][:3000]
    knobs = dict(item.split("=") for item in plan.group(1).split(", "))
    for name in ("add_wait_share", "release_wait_share", "cooldown_s", "recent_steps", "min_gain", "window_steps"):
        assert float(knobs[name]) == float(getattr(defaults, name)), (name, knobs[name])


def test_the_addition_was_judged_and_kept(elastic_run):
    """The check after the change: steps/s rose by at least min_gain (0.05) with the newcomer beside the straggler,
    so the addition is kept (not undone), and no request failed through it."""
    output, run_dir = elastic_run["output"], elastic_run["run_dir"]
    verdict = VERDICT.search(output)
    assert verdict and "kept the add" in verdict.group(0), output[-3000:]
    kept = re.search(r"agrpo fleet: 2 replica\(s\): kept the add: steps/s (\d+\.\d+) -> (\d+\.\d+)", output)
    assert kept and float(kept.group(2)) >= float(kept.group(1)) * 1.05, output[-3000:]
    assert "undo the add" not in output and "undo the release" not in output, output[-3000:]
    history = [e for e in json.loads((run_dir / "log_history.json").read_text()) if "proxy/routed" in e]
    assert history[-1]["proxy/failed"] == 0


def test_the_run_completed_and_learned(elastic_run):
    metrics = json.loads((elastic_run["run_dir"] / "metrics.json").read_text())
    assert metrics["global_step"] == STEPS
    assert metrics["reward_last"] > metrics["reward_first"] + 0.3, metrics


def test_the_fleet_size_reached_the_log_and_tensorboard(elastic_run):
    run_dir = elastic_run["run_dir"]
    history = [e for e in json.loads((run_dir / "log_history.json").read_text()) if "fleet/replicas" in e]
    sizes = [entry["fleet/replicas"] for entry in history]
    assert sizes[0] == 1.0 and 2.0 in sizes, sizes
    seconds = [entry["fleet/replica_seconds"] for entry in history]
    assert seconds == sorted(seconds) and seconds[-1] > seconds[0]
    assert {"train/fleet/replicas", "train/fleet/replica_seconds"} <= tensorboard_tags(run_dir)


def test_both_replicas_served_and_the_newcomer_held_the_current_adapter(elastic_run):
    run_dir = elastic_run["run_dir"]
    history = [e for e in json.loads((run_dir / "log_history.json").read_text()) if "proxy/routed" in e]
    routed = {index: max(e.get(f"proxy/replica{index}/routed", 0) for e in history) for index in (0, 1)}
    assert routed[0] > 0 and routed[1] > 0, routed  # replica 1 leaves the stats once released: its peak counts
    proxy_log = read(run_dir / "logs" / "proxy.log")
    assert re.search(r"replica 1 \(http://127\.0\.0\.1:\d+\) admitted", proxy_log)
    loaded = [
        int(v)
        for v in re.findall(r"Loaded new LoRA adapter: name 'trl-policy-v(\d+)'", read(run_dir / "logs" / "vllm-1.log"))
    ]
    assert loaded and loaded == sorted(set(loaded)), loaded  # replayed at admission, then each later version once


def test_nothing_left_running(elastic_run):
    assert elastic_run["left"] == {}


def test_idle_replicas_were_released_drained_and_the_release_judged(elastic_run):
    """The second phase: the trainer is the slow part, the replicas idle. The fleet gives the newest replica back
    (no new requests, those in flight finish; its process is parked until the release is judged), judges the
    release on the steps after it (kept: one replica keeps the pace, the parked process stops), fails no request, and
    the end line counts both sizes."""
    output, run_dir = elastic_run["output"], elastic_run["run_dir"]
    released = re.search(
        r"agrpo fleet: 2 -> 1 replicas \(vllm-1 draining\): replicas idle: the trainer waited only (\d+)% of each step",
        output,
    )
    from agrpo.config.schema.inference import FleetConfig

    assert released and int(released.group(1)) <= 100 * FleetConfig().release_wait_share, output[-3000:]
    assert RELEASED in output and "1 replica(s) at the end" in output, output[-3000:]
    assert re.search(r"agrpo fleet: 1 replica\(s\): kept the release: steps/s", output), output[-3000:]
    # parked (running, out of the proxy) until then, so that an undo would need no boot; stopped once kept
    kept = output.index("kept the release")
    assert output.index("agrpo fleet: vllm-1 stopped: the release was kept") > kept, output[-3000:]
    history = [e for e in json.loads((run_dir / "log_history.json").read_text()) if "fleet/replicas" in e]
    sizes = [entry["fleet/replicas"] for entry in history]
    assert sizes[-1] == 1.0 and 2.0 in sizes, sizes
    routed = [e for e in history if "proxy/routed" in e]
    assert routed[-1]["proxy/failed"] == 0
