"""The bottleneck reading of TRL's metrics (pure)."""

from agrpo.trainer.console.bottleneck import diagnose


def steps(n=5, **metrics):
    return [dict(metrics) for _ in range(n)]


def test_no_timing_no_verdict():
    assert diagnose([]) is None
    assert diagnose(steps(**{"loss": 0.1})) is None


def test_trainer_waiting_for_rollouts_is_generation_bound():
    verdict = diagnose(steps(**{"perf/step_s": 2.0, "perf/rollout_wait_s": 1.2, "perf/weight_sync_s": 0.1}))
    assert verdict.kind == "generation-bound"
    assert "60%" in verdict.line and "inference.replicas" in verdict.line and "max_inflight_tasks" in verdict.line
    assert "weight_sync_steps" not in verdict.line


def test_slow_sync_is_mentioned_when_generation_bound():
    verdict = diagnose(steps(**{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.5, "perf/weight_sync_s": 0.3}))
    assert verdict.kind == "generation-bound" and "trainer.weight_sync_steps" in verdict.line


def test_backpressure_or_stale_drops_are_trainer_bound():
    backpressured = diagnose(
        steps(
            **{
                "perf/step_s": 3.0,
                "perf/rollout_wait_s": 0.0,
                "rollout/backpressure_s": 1.5,
                "sample/rollout_queue_size": 64,
            }
        )
    )
    assert backpressured.kind == "trainer-bound"
    assert "token_budget" in backpressured.line and "gradient_checkpointing" in backpressured.line
    stale = diagnose(
        steps(
            **{
                "perf/step_s": 3.0,
                "perf/rollout_wait_s": 0.1,
                "sample/dropped_stale_total": 40,
                "batch/samples_per_step": 160,
            }
        )
    )
    assert stale.kind == "trainer-bound" and stale.stale_share == 0.2
    assert "20% of generated samples dropped as stale (200 of 1000)" in stale.line
    assert "lower trainer.max_inflight_tasks" in stale.line and "raise trainer.max_staleness" in stale.line


def test_stale_waste_while_generation_bound_names_the_staleness_knobs_not_more_requests():
    """The smoke run's shape: the trainer waits for rollouts, yet a third of what was generated was thrown away.
    Asking for more requests in flight would raise the waste; the verdict names the knobs that lower it."""
    window = steps(
        **{
            "perf/step_s": 0.57,
            "perf/rollout_wait_s": 0.2,
            "perf/weight_sync_s": 0.05,
            "sample/dropped_stale_total": 8.0,
            "batch/samples_per_step": 16.0,
        }
    )
    verdict = diagnose(window)
    assert verdict.kind == "generation-bound"
    assert verdict.stale_share == 8 / 24
    assert "33% of generated samples dropped as stale (40 of 120)" in verdict.line
    assert "first stop the waste: lower trainer.max_inflight_tasks" in verdict.line
    assert "raise trainer.max_staleness" in verdict.line
    assert "requests in flight (trainer.max_inflight_tasks)" not in verdict.line  # no advice to add requests
    assert "inference.replicas" in verdict.line  # once the waste is gone, more replicas is still the fix


def test_a_little_stale_waste_keeps_the_generation_advice():
    window = steps(
        **{
            "perf/step_s": 1.0,
            "perf/rollout_wait_s": 0.5,
            "sample/dropped_stale_total": 1.0,
            "batch/samples_per_step": 19.0,
        }
    )
    verdict = diagnose(window)
    assert verdict.kind == "generation-bound" and verdict.stale_share == 0.05
    assert "5% of generated samples dropped as stale" in verdict.line
    assert "requests in flight (trainer.max_inflight_tasks)" in verdict.line and "max_staleness" not in verdict.line


def test_stale_share_counts_over_the_window_from_real_log_values():
    from agrpo.trainer.console.bottleneck import stale_share

    # sample/dropped_stale_total and batch/samples_per_step of steps 3-6 of a 60-step smoke run
    window = [{"sample/dropped_stale_total": d, "batch/samples_per_step": 16.0} for d in (136.0, 24.0, 0.0, 24.0)]
    assert stale_share(window) == 184 / (184 + 64)
    assert stale_share([{"loss": 0.1}]) is None
    assert stale_share([{"sample/dropped_stale_total": None, "batch/samples_per_step": 16.0}]) == 0.0


def test_neither_waiting_nor_backpressure_is_balanced():
    verdict = diagnose(steps(**{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.05}))
    assert verdict.kind == "balanced"


def test_callback_reports_every_n_steps_and_keeps_a_final_verdict(caplog):
    import logging
    from types import SimpleNamespace

    from agrpo.trainer.trl_backend import BottleneckCallback

    callback = BottleneckCallback(every=2)
    with caplog.at_level(logging.DEBUG, logger="agrpo.trainer.trl_backend"):  # file-only detail since the console
        for step in range(1, 6):
            callback.on_log(
                None, SimpleNamespace(global_step=step), None, logs={"perf/step_s": 1.0, "perf/rollout_wait_s": 0.8}
            )
        callback.on_log(None, SimpleNamespace(global_step=6), None, logs={"loss": 0.0})  # not a step log
        callback.on_train_end(None, SimpleNamespace(global_step=5), None)
    lines = [r.getMessage() for r in caplog.records if "bottleneck" in r.getMessage()]
    assert len(lines) == 3  # steps 1-2, steps 3-4, whole run
    assert "steps 1-2" in lines[0] and "whole run" in lines[-1]
    assert callback.final.kind == "generation-bound"


def test_with_auto_inflight_the_advice_is_the_bound_or_capacity_not_the_knob_the_controller_turns():
    auto = {"rollout/inflight_target": 16.0, "batch/samples_per_step": 16.0, "sample/dropped_stale_total": 0.0}
    window = steps(**auto, **{"perf/step_s": 2.0, "perf/rollout_wait_s": 1.2})
    verdict = diagnose(window)
    assert verdict.kind == "generation-bound"
    assert "inference.replicas" in verdict.line and "trainer.max_staleness" in verdict.line
    assert "requests in flight (trainer.max_inflight_tasks)" not in verdict.line
    wasteful = diagnose(steps(**{**window[0], "perf/rollout_wait_s": 0.0, "sample/dropped_stale_total": 8.0}))
    assert "lower trainer.max_inflight_tasks" not in wasteful.line and "raise trainer.max_staleness" in wasteful.line


def test_sample_accounting_says_where_the_generated_samples_went():
    from agrpo.trainer.console.bottleneck import accounting_line, sample_accounting

    history = [
        {"rollout/samples_generated_total": 40.0, "batch/samples_per_step": 16.0, "sample/dropped_stale_total": 8.0},
        {"rollout/samples_generated_total": 16.0, "batch/samples_per_step": 16.0},
        {"batch/samples_per_step": 16.0},
    ]
    accounting = sample_accounting(history)
    assert accounting == {"generated": 56.0, "used": 48.0, "dropped_stale": 8.0, "left_at_end": 0.0}
    line = accounting_line(accounting)
    assert line.startswith("generated 56, used 48, dropped 8 as stale (14%") and "0 generated but not trained" in line
    trl_only = sample_accounting([{"batch/samples_per_step": 16.0, "sample/dropped_stale_total": 16.0}])
    assert trl_only["generated"] is None and accounting_line(trl_only).startswith("used 16, dropped 16 as stale (50%")


def test_a_run_without_a_learning_signal_is_not_called_balanced():
    from agrpo.trainer.console.bottleneck import without_signal

    balanced = diagnose(steps(**{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.05}))
    said = without_signal(balanced, "no tool call in 80 episodes")
    assert said.kind == "no learning signal" and "keep pace" not in said.line
    assert said.line.startswith("no learning signal (no tool call in 80 episodes): its steps trained nothing")
    assert balanced.facts in said.line and balanced.facts.startswith("step 1.00 s")
    slow = diagnose(steps(**{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.8}))
    assert without_signal(slow, "x").line.endswith(f"; once it learns, {slow.line}")  # the pace's advice kept
