"""A fleet that sizes itself, the way a user runs it: `python -m agrpo +recipe=smoke inference.replicas=auto
inference.min_replicas=1 inference.max_replicas=2`. The launcher starts one replica; once training has started the
test holds that replica to a quarter of a core (a cgroup CPU quota on its whole process group, tests/cpu_quota.py),
so the trainer waits for rollouts most of each step. The fleet controller must see it, start the second replica on
its own, hand it to the proxy once healthy (adapters replayed), and judge it. Once the addition was kept, the test
frees the replica and holds the trainer's own process to a tenth of a core instead (not its rollout and reward
children: generation stays fast), so the two replicas idle: the fleet must give one back, drained, and judge that
too. The run must complete, learn, log the fleet's size and replica-seconds, and leave nothing running. The slow
replica and the slow trainer are the test's; every decision is the product's.
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
# The policy's shares for a noisy 2-core machine (docs/elastic.md measured 0.25 too): in a fresh-clone CI run the
# trainer, held to a tenth of a core, waited 3-9% of its latest 20 steps (0.4-0.7 s each: one 1-2 s hiccup is a few
# percent of them), never the default 2%, and the fleet held both replicas to the end. The release itself (the
# decision, the drain, the stop, the verdict) is what this run shows; the defaults are the policy table's
# (tests/fleet/test_policy.py) and the simulation's (benchmarks/fleet_simulation.py). A shorter cool-down leaves the
# release more steps after the add's.
SHARES = [
    "inference.fleet.add_wait_share=0.25",
    "inference.fleet.release_wait_share=0.1",
    "inference.fleet.cooldown_s=10",
]
# vLLM's start takes 40-120 s on 2 busy cores, about the rest of a 60-step smoke run: the newcomer serves from steps
# 30-40 and is judged by step ~50; the release then needs the cool-down and inference.fleet.recent_steps (20) quiet
# steps (benchmarks/elastic.py --release 0.1: decided at step ~87 of 100). 130 leave room for a slower machine.
STEPS = 130
TRAINER_SHARE = 0.1  # of a core, for the trainer's own process once the addition was kept
VERDICT = re.compile(
    r"agrpo fleet: 2 replica\(s\): kept the add|agrpo fleet: 2 -> 1 replicas \(vllm-1 draining\): undo the add, it did "
    r"not help"
)
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
        *SHARES,
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
        if "kept the add" in read(output) and not ended():
            trainer = trainer_pids(run_dir)
            with cpu_quota(trainer, share=TRAINER_SHARE, name=f"elastic-trainer-{os.getpid()}"):
                wait_for(lambda: RELEASED in read(output) or ended(), 1200, "the idle replica's release")
                launcher.wait(timeout=1200)  # held to the end: a free trainer would want the replica back
        code = launcher.wait(timeout=1500)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert code == 0, read(output)[-5000:]
    return {"run_dir": run_dir, "output": read(output), "left": left_behind(token)}


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
    if "the release was kept" in output:
        assert log.count("holding no device") == 2 and log.rindex("holding no device") > log.index("Starting vLLM")


def test_the_addition_was_judged_and_an_undone_one_drained(elastic_run):
    """The check after the change: kept if steps/s rose, else undone (on 2 cores the newcomer shares a core with
    the trainer, docs/elastic.md), and an undone addition is drained and stopped, its requests finished, none failed."""
    output, run_dir = elastic_run["output"], elastic_run["run_dir"]
    verdict = VERDICT.search(output)
    assert verdict, output[-3000:]
    history = [e for e in json.loads((run_dir / "log_history.json").read_text()) if "proxy/routed" in e]
    assert history[-1]["proxy/failed"] == 0
    if "undo the add" in verdict.group(0):
        assert re.search(r"agrpo fleet: 1 replica\(s\) serving: vllm-1 drained and stopped after \d+ s", output)
        assert "1 replica(s) at the end" in output


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
    assert "kept the add" in output, "the addition was undone: no idle phase to show (" + output[-2000:] + ")"
    released = re.search(
        r"agrpo fleet: 2 -> 1 replicas \(vllm-1 draining\): replicas idle: the trainer waited only (\d+)% of each step",
        output,
    )
    assert released and int(released.group(1)) <= 10, output[-3000:]  # release_wait_share=0.1
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
