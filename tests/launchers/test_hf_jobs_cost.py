"""Cost before and after a Jobs run (pure): prices from the hardware list or the table, each Job's running time x
its flavor's price, $ per 1,000 samples, the dry run's CPU suggestion, and what the launching terminal shows."""

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from agrpo.launchers.hf_jobs.after import next_commands
from agrpo.launchers.hf_jobs.cost import (
    HUB_SOURCE,
    TABLE_SOURCE,
    Prices,
    cost_lines,
    job_costs,
    prices_from_hardware,
    read_prices,
    running_seconds,
    samples_trained,
)
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from agrpo.launchers.hf_jobs.terminal import JobLogView, banner_lines
from tests.specs import spec_for

JOBS = ["launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=r1", "launcher.hf_jobs.namespace=alice"]


def job(name, role, flavor, running=None, started=None, finished=None, stage="COMPLETED"):
    durations = SimpleNamespace(running_secs=running) if running is not None else None
    return SimpleNamespace(
        id=f"id-{name}",
        labels={"name": name, "agrpo-role": role},
        flavor=flavor,
        durations=durations,
        started_at=started,
        finished_at=finished,
        status=SimpleNamespace(stage=stage),
    )


def test_hardware_prices_per_minute_become_per_hour_and_the_table_is_the_marked_fallback():
    listed = [SimpleNamespace(name="h200", unit_cost_usd=0.09, unit_label="minute")]
    assert round(prices_from_hardware(listed)["h200"], 6) == 5.4
    hub = read_prices(SimpleNamespace(list_jobs_hardware=lambda: listed))
    assert hub.source == HUB_SOURCE and round(hub.of("h200"), 2) == 5.40

    def unreachable():
        raise ConnectionError("no network")

    fallback = read_prices(SimpleNamespace(list_jobs_hardware=unreachable))
    assert fallback.source == TABLE_SOURCE and fallback.of("h200") == 5.00 and "estimate" in TABLE_SOURCE


def test_each_job_costs_its_running_time_at_its_flavors_price():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    jobs = [
        job("r1-vllm-0", "replica", "h200", running=1800),
        job("r1-trainer", "trainer", "h200x2", started=start, finished=start + timedelta(minutes=15)),
        job("odd", "replica", "future-gpu", running=60),
    ]
    assert running_seconds(jobs[1]) == 900.0
    costs = job_costs(jobs, Prices({"h200": 5.0, "h200x2": 10.0}, HUB_SOURCE))
    assert [(c.name, c.running_s, c.usd) for c in costs] == [
        ("r1-vllm-0", 1800, 2.5),
        ("r1-trainer", 900.0, 2.5),
        ("odd", 60, None),
    ]
    lines = cost_lines(costs, Prices({}, HUB_SOURCE), samples=2000)
    assert lines[0] == f"  cost         $5.00 for 46m00s of Job time (prices: {HUB_SOURCE}); no price for future-gpu"
    assert lines[1] == "  per sample   $2.50 per 1,000 samples trained (2,000)"
    assert lines[2].split() == ["replica", "r1-vllm-0", "h200", "COMPLETED", "30m00s", "$2.50"]
    assert lines[4].split()[-3:] == ["1m00s", "price", "unknown"]


def test_samples_trained_is_the_mean_logged_batch_times_the_steps():
    history = [{"step": 1, "batch/samples_per_step": 16.0}, {"step": 2, "batch/samples_per_step": 14.0}]
    assert samples_trained(history) == 30 and samples_trained(history, steps=10) == 150
    assert samples_trained([{"step": 3}]) is None


def test_the_dry_run_suggests_cpu_flavors_for_a_model_agrpo_builds():
    smoke = build_jobs_plan(spec_for("+recipe=smoke", *JOBS, "inference.replicas=2"), launch_id="L")
    note = next(n for n in smoke.notes if "small enough for CPU" in n)
    assert "~$0.09/hour instead of ~$15.00/hour" in note and "launcher.hf_jobs.replica_flavor=cpu-upgrade" in note
    assert "estimated cost: $15.00/hour" in smoke.render() and note in smoke.render()
    gsm8k = build_jobs_plan(spec_for("+recipe=gsm8k", *JOBS), launch_id="L")
    assert not any("small enough for CPU" in n for n in gsm8k.notes)  # a Hub model: the config's flavors stand


def test_the_commands_printed_after_a_run_name_the_pulled_copy():
    plan = build_jobs_plan(spec_for("+recipe=smoke", *JOBS, "lora.r=4"), launch_id="L")
    plan.after.eval_overrides = ["+recipe=smoke", "lora.r=4"]
    lines = next_commands(plan.after, "r1", "alice", [])
    assert lines[0] == "next (on this machine):"
    assert lines[1].split()[1:] == ["agrpo", "pull", "r1", "--namespace", "alice", "(into", "outputs/smoke/r1)"]
    assert lines[2].split()[1:] == [
        "agrpo",
        "eval",
        "+recipe=smoke",
        "lora.r=4",
        "eval.adapter=outputs/smoke/r1/final_adapter",
    ]
    assert lines[5].split()[1:4] == ["vllm", "serve", plan.inputs[0].source]  # the model as this machine has it
    assert "/bucket" not in "\n".join(lines)
    rehearsed = next_commands(plan.after, "r1", "rehearsal", ["--rehearsal-dir", "/tmp/r"])
    assert rehearsed[1].split()[1:5] == ["agrpo", "pull", "r1", "--rehearsal-dir"]
    assert rehearsed[-1].split()[1:] == ["agrpo", "jobs", "status", "r1", "--rehearsal-dir", "/tmp/r"]
    other = spec_for("+recipe=smoke", *JOBS, "sync.bucket=team-runs")
    assert "agrpo pull alice/team-runs/r1" in next_commands(build_jobs_plan(other).after, "r1", "alice", [])[1]


def test_the_jobs_next_block_is_not_echoed_and_the_banner_names_the_files():
    view = JobLogView()
    lines = ["step 3/3  reward 0.5", "next:", "  evaluate  agrpo eval eval.adapter=/bucket/r1/final_adapter", "done"]
    assert [line for line in lines if view.shows(line)] == ["step 3/3  reward 0.5", "done"]
    plan = build_jobs_plan(spec_for("+recipe=gsm8k", *JOBS), launch_id="L")
    plan.after.launch_log = "outputs/gsm8k/x/logs/launch.log"
    banner = "\n".join(banner_lines(plan))
    assert "hf://buckets/alice/agrpo-runs/r1" in banner and "outputs/gsm8k/x/logs/launch.log" in banner
    assert "logs/install.log (pip)" in banner and "~$10.00/hour" in banner
