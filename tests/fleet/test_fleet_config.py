"""inference.replicas=auto in the config, its validation, the resolved proxy choice and the local plan (pure)."""

from __future__ import annotations

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.resolve import replica_count, uses_proxy
from agrpo.config.schema.inference import fleet_bounds, is_auto_fleet
from agrpo.config.validate import find_problems
from agrpo.launchers.local import build_local_plan
from tests.plans import bound_example
from tests.specs import spec_for

AUTO = ["inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2"]


def compose(*overrides):
    return compose_run_config(["+recipe=smoke", *overrides], output_dir="/runs/r1")


def test_a_number_keeps_todays_meaning():
    cfg = compose("inference.replicas=3")
    assert not is_auto_fleet(cfg.inference) and fleet_bounds(cfg.inference) == (3, 3)
    assert find_problems(cfg) == []


def test_auto_starts_min_replicas_behind_the_proxy():
    cfg = compose(*AUTO)
    assert is_auto_fleet(cfg.inference) and fleet_bounds(cfg.inference) == (1, 2)
    assert find_problems(cfg) == []
    assert replica_count(cfg) == 1 and uses_proxy(cfg)  # one replica, but the fleet changes through the proxy


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["inference.replicas=many"], "inference.replicas='many' must be a number >= 1 or auto"),
        (["inference.replicas=0"], "inference.replicas must be >= 1"),
        ([*AUTO, "inference.min_replicas=3"], "inference.min_replicas=3 exceeds inference.max_replicas=2"),
        ([*AUTO, "inference.min_replicas=0"], "inference.min_replicas must be >= 1"),
        ([*AUTO, "inference.urls=[http://h:1]"], "cannot size servers given in inference.urls"),
        ([*AUTO, "inference.use_proxy=false"], "drop inference.use_proxy=false"),
        ([*AUTO, "inference.fleet.release_wait_share=0.5"], "inference.fleet.release_wait_share=0.5 must be below"),
        ([*AUTO, "inference.fleet.window_steps=1"], "inference.fleet.window_steps must be >= 2"),
        ([*AUTO, "inference.fleet.poll_s=0"], "inference.fleet.poll_s must be > 0"),
        ([*AUTO, "inference.fleet.recent_steps=4"], "inference.fleet.recent_steps=4 must be >= inference.fleet.window"),
        ([*AUTO, "inference.fleet.starved_wait_share=0.01"], "inference.fleet.starved_wait_share=0.01 must be between"),
        ([*AUTO, "inference.fleet.starved_steps=1"], "inference.fleet.starved_steps=1 must be >= 2 and <= inference"),
        ([*AUTO, "inference.fleet.starved_steps=6"], "inference.fleet.starved_steps=6 must be >= 2 and <= inference"),
    ],
)
def test_bad_fleets_name_their_key(overrides, fragment):
    problems = find_problems(compose(*overrides))
    assert any(fragment in problem for problem in problems), problems


def test_auto_on_every_launcher_agrpo_ships():
    for launcher in ("local", "accelerate", "hf_jobs"):
        problems = find_problems(compose(*AUTO, f"launcher={launcher}"))
        assert not any("is built for launcher" in p for p in problems), (launcher, problems)


def test_the_trainer_jobs_config_may_carry_its_replica_jobs_urls():
    """Inside the trainer Job (role=trainer, launcher=hf_jobs) the urls are the replica Jobs it found; elsewhere a
    fleet that sizes itself refuses given urls and role=trainer."""
    job = [*AUTO, "launcher=hf_jobs", "role=trainer", "inference.urls=[https://a--8000.hf.jobs]"]
    problems = find_problems(compose(*job))
    assert not any("inference.replicas=auto" in p or "inference.urls" in p for p in problems), problems
    local = find_problems(compose(*AUTO, "role=trainer", "inference.urls=[http://h:1]"))
    assert any("needs role=all" in p for p in local) and any("cannot size servers" in p for p in local)


def test_the_plan_starts_min_and_holds_the_spares_on_their_own_cores():
    cfg = spec_for("+recipe=smoke", *AUTO, output_dir="/runs/r1")
    plan = bound_example(build_local_plan(cfg, "/runs/r1", "cpu", 0, range(2), python="py"))
    assert [s.name for s in plan.services] == ["vllm-0", "proxy"]
    assert "--upstream http://127.0.0.1:8100" in " ".join(plan.services[1].argv)
    assert "8101" not in " ".join(plan.services[1].argv)  # the spare is handed to the proxy when it is healthy
    assert plan.trainer.argv[-1] == "1"
    # the trainer has the thread the one replica leaves, unpinned: the spare's slot is the core it would be pinned to
    assert plan.trainer.env["OMP_NUM_THREADS"] == "1" and "AGRPO_TRAINER_CPUS" not in plan.trainer.env
    fleet = plan.fleet
    assert (fleet.min_replicas, fleet.max_replicas) == (1, 2)
    assert [s.name for s in fleet.spares] == ["vllm-1"] and fleet.spares[0].port == 8101
    assert fleet.spares[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert fleet.spares[0].env["VLLM_API_KEY"] == plan.services[0].env["VLLM_API_KEY"]  # keyed like the others
    assert fleet.policy["window_steps"] == 5 and fleet.inflight_ceiling == 16
    text = plan.render()
    assert "[fleet] auto: 1..2 replicas; starts 1" in text and "vllm-1 (on demand)" in text
    # the spare stands by (inference.fleet.standby): agrpo's module imports the server's, then waits to be added
    replica_args = plan.services[0].argv[3:]
    assert fleet.spares[0].argv[:4] == ["py", "-m", "agrpo.inference.standby", "vllm.entrypoints.openai.api_server"]
    assert fleet.spares[0].argv[4:] == [a.replace("8100", "8101") for a in replica_args]
    assert "standby=1" in text and "-m agrpo.inference.standby vllm.entrypoints.openai.api_server" in text


def test_spares_start_cold_without_a_standby():
    cfg = spec_for("+recipe=smoke", *AUTO, "inference.fleet.standby=false", output_dir="/runs/r1")
    plan = build_local_plan(cfg, "/runs/r1", "cpu", 0, range(2), python="py")
    assert plan.fleet.spares[0].argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert plan.fleet.policy["standby"] == 0.0


def test_a_fixed_fleet_has_no_fleet_plan():
    cfg = compose("inference.replicas=2")
    plan = build_local_plan(cfg, "/runs/r1", "cpu", 0, range(2), python="py")
    assert plan.fleet is None and "[fleet]" not in plan.render()
