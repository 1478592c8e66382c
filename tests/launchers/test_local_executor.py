"""The local executor runs its plan and nothing else: every step it takes is one the plan carries (and the dry run
prints), with the plan's values and the ports and secrets it makes when it runs (bound into the plan), and it never
reads the config. Processes are recorded, not started (what starting them does is covered by the e2e runs);
everything else (files, the run-dir check, the port reservations, the teardown order) is real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agrpo.launchers.binding as binding
import agrpo.launchers.local as local
from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.errors import ConfigError, LaunchError
from agrpo.launchers.local import LocalLauncher, build_local_plan
from agrpo.launchers.plan import PLACEHOLDER, bind
from agrpo.trainer.trainer_error import trainer_error_file


class Recorder:
    def __init__(self):
        self.steps: list[tuple] = []
        self.dead: dict[str, object] = {}  # processes that exit as soon as they start -> what they do first


@pytest.fixture()
def recorded(monkeypatch):
    record = Recorder()

    class FakeProcess:
        def __init__(self, name, argv, env, log_path=None, health_url=None):
            self.name, self.argv, self.env, self.log_path = name, list(argv), dict(env), log_path

        def start(self, inherit_output=False):
            record.steps.append(("start", self.name, self.argv, self.env))
            if self.name in record.dead:
                record.dead[self.name]()

        @property
        def exit_code(self):
            return 1 if self.name in record.dead else None

        def wait_healthy(self, timeout_s, check=None):
            if check is not None:
                check()
            record.steps.append(("healthy", self.name, timeout_s))

    class FakeSupervisor:
        def __init__(self, replicas, max_restarts):
            record.steps.append(("supervise", [r.name for r in replicas], max_restarts))

    def trainer_runs(trainer, supervisor):
        record.steps.append(("wait", trainer.name))
        (Path(record.run_dir) / "metrics.json").write_text(json.dumps({"reward_last": 0.25}))  # the trainer's output
        return 0

    monkeypatch.setattr(local, "ManagedProcess", FakeProcess)
    monkeypatch.setattr(local, "ReplicaSupervisor", FakeSupervisor)
    monkeypatch.setattr(local, "wait_supervised", trainer_runs)
    monkeypatch.setattr(local, "prepare_model", lambda model: record.steps.append(("model", model)))
    monkeypatch.setattr(
        local,
        "stop_all",
        lambda processes, timeout_s: record.steps.append(("stop", [p.name for p in processes], timeout_s)),
    )
    return record


@pytest.fixture()
def made(monkeypatch):
    """The values the executor made for each plan it ran (the real ones: ports reserved, secrets new)."""
    values: list[dict[str, str]] = []
    real = binding.make_values

    def spy(placeholders, reservations):
        values.append(real(placeholders, reservations))
        return values[-1]

    monkeypatch.setattr(binding, "make_values", spy)
    return values


BASE_PORT = 23100  # away from 8100, where real runs on a shared test machine search (the locks keep them apart)


def plan_for(run_dir: Path, *overrides: str):
    cfg = prepare(
        compose_run_config(
            ["+recipe=smoke", "inference.replicas=2", f"inference.base_port={BASE_PORT}", *overrides],
            output_dir=str(run_dir),
        ),
        cuda_available=False,
    )
    return build_local_plan(cfg, str(run_dir), "cpu", 0, [0, 1], python="py")


def test_the_executor_does_exactly_the_plans_steps(recorded, made, tmp_path):
    run_dir = tmp_path / "run"
    plan = plan_for(run_dir, "inference.startup_timeout_s=77", "inference.max_restarts=4", "launcher.stop_timeout_s=9")
    plan.files = {"config.yaml": "a: 1\n", "sub/extra.yaml": "b: 2\n"}
    recorded.run_dir = run_dir
    assert LocalLauncher().execute(plan) == {"reward_last": 0.25}  # no config: the plan is all it reads
    services = [spec.name for spec in plan.services]
    assert services == ["vllm-0", "vllm-1", "proxy"]
    starts = [step for step in recorded.steps if step[0] == "start"]
    ran = bind(plan, made[0])
    # on a CPU machine the trainer starts with the replicas (it loads while they boot), before the proxy
    assert plan.supervision.trainer_during_boot
    assert [(name, argv, env) for _, name, argv, env in starts] == [
        (spec.name, spec.argv, spec.env) for spec in [*ran.services[:2], ran.trainer, ran.services[2]]
    ]
    assert recorded.steps[0] == ("model", plan.model) and plan.model.builder == "agrpo.models.tiny.build_tiny_model"
    healthy = [step for step in recorded.steps if step[0] == "healthy"]
    assert [name for _, name, _ in healthy] == services and all(0 < t <= 77 for *_, t in healthy)
    assert ("supervise", ["vllm-0", "vllm-1"], 4) in recorded.steps
    assert recorded.steps[-1] == ("stop", ["trainer", "proxy", "vllm-1", "vllm-0"], 9.0)
    assert [p.relative_to(run_dir).as_posix() for p in sorted(run_dir.rglob("*.yaml"))] == [
        "config.yaml",
        "sub/extra.yaml",
    ]
    printed = plan.render()
    assert "[model] build" in printed and "[run dir] refuse an earlier run's outputs" in printed
    assert (
        "healthy within 77 s; restart a dead replica up to 4 time(s); each process group stopped within 9 s" in printed
    )
    assert all(f"[file] {run_dir}/{name}" in printed for name in plan.files)


def test_the_run_dir_check_reads_the_plans_resume(recorded, tmp_path):
    """The trainer Job builds its plan once it knows whether it resumes; the executor checks with that value."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-2").mkdir(parents=True)
    plan = plan_for(tmp_path / "elsewhere")
    plan.run_dir = str(run_dir)
    with pytest.raises(ConfigError, match="already holds an earlier run's outputs"):
        LocalLauncher().execute(plan)
    assert recorded.steps == []  # refused before the model step and before any process
    plan.resume = "true"
    recorded.run_dir = run_dir
    LocalLauncher().execute(plan)
    assert recorded.steps[0][0] == "model"


def test_one_replica_is_not_supervised_and_the_plan_says_so(recorded, tmp_path):
    run_dir = tmp_path / "run"
    cfg = prepare(compose_run_config(["+recipe=smoke"], output_dir=str(run_dir)), cuda_available=False)
    plan = build_local_plan(cfg, str(run_dir), "cpu", 0, [0, 1], python="py")
    recorded.run_dir = run_dir
    LocalLauncher().execute(plan)
    assert not [step for step in recorded.steps if step[0] == "supervise"]
    assert "no restarts" in plan.render() and plan.supervision.restart_replicas is False


def test_what_runs_is_the_printed_plan_with_the_values_made_when_it_runs(recorded, made, tmp_path):
    """The dry run's plan and the executed one differ by the bound values alone: the ports reserved from
    inference.base_port (held while the run lasts, then released) and fresh secrets, by name in the printed plan."""
    run_dir = tmp_path / "run"
    plan = plan_for(run_dir)
    printed = plan.render()
    assert "--port <port:vllm-0>" in printed and "AGRPO_PROXY_ADMIN_TOKEN=<secret:proxy-admin-token>" in printed
    recorded.run_dir = run_dir
    LocalLauncher().execute(plan)
    assert plan.render() == printed  # running the plan left it as printed
    (values,) = made
    ports = [int(values[f"<port:{name}>"]) for name in ("vllm-0", "vllm-1", "proxy")]
    assert ports == sorted(set(ports)) and ports[0] >= BASE_PORT
    assert len(values["<secret:replica-key>"]) >= 43 and values["<secret:proxy-admin-token>"] not in printed
    ran = bind(plan, values)
    started = [step[1:] for step in recorded.steps if step[0] == "start"]
    assert sorted(started) == sorted((spec.name, spec.argv, spec.env) for spec in [*ran.services, ran.trainer])
    assert not PLACEHOLDER.search(json.dumps(started))
    expected = printed
    for placeholder, value in values.items():  # a secret stays hidden once bound
        expected = expected.replace(placeholder, value if placeholder.startswith("<port:") else "<set>")
    assert ran.render().splitlines() == [
        line for line in expected.splitlines() if not line.startswith(("[ports] ", "[secrets] "))
    ]
    again = binding.reserve_ports(3, ports[0], search=ports[-1] - ports[0] + 1)
    again.release()
    assert again.ports == ports  # released when the run ended


def test_the_trainer_starts_with_the_replicas_unless_told_to_wait(recorded, tmp_path):
    run_dir = tmp_path / "run"
    recorded.run_dir = run_dir
    plan = plan_for(run_dir, "launcher.trainer_during_boot=false")
    assert not plan.supervision.trainer_during_boot
    assert "[trainer start] once the services are healthy: launcher.trainer_during_boot=false" in plan.render()
    LocalLauncher().execute(plan)
    order = [step[:2] for step in recorded.steps if step[0] in ("start", "healthy")]
    assert order == [
        ("start", "vllm-0"),
        ("start", "vllm-1"),
        ("healthy", "vllm-0"),
        ("healthy", "vllm-1"),
        ("start", "proxy"),
        ("healthy", "proxy"),
        ("start", "trainer"),
    ]
    recorded.steps.clear()
    early = plan_for(tmp_path / "early")
    recorded.run_dir = tmp_path / "early"
    assert "[trainer start] with the replicas: it loads while they boot" in early.render()
    LocalLauncher().execute(early)
    order = [step[:2] for step in recorded.steps if step[0] in ("start", "healthy")]
    assert order[:3] == [("start", "vllm-0"), ("start", "vllm-1"), ("start", "trainer")]


def test_a_trainer_that_fails_while_the_replicas_boot_ends_the_run_at_once_with_its_error(recorded, tmp_path):
    run_dir = tmp_path / "run"
    plan = plan_for(run_dir)
    error_file = trainer_error_file(run_dir)
    error_file.parent.mkdir(parents=True)
    # what the trainer leaves before it exits (after the executor cleared an earlier run's error)
    recorded.dead["trainer"] = lambda: error_file.write_text("the reward function my_reward raised KeyError: 'answer'")
    with pytest.raises(LaunchError) as error:
        LocalLauncher().execute(plan)
    message = str(error.value)
    assert (
        "my_reward raised KeyError" in message
        and "It ended while the replicas were still starting; they were stopped" in message
    )
    assert not [step for step in recorded.steps if step[0] == "healthy"]  # no replica was waited for
    assert recorded.steps[-1][0] == "stop" and recorded.steps[-1][1] == ["trainer", "vllm-1", "vllm-0"]
