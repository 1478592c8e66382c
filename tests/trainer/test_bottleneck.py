"""The bottleneck reading of TRL's metrics (pure)."""

from agrpo.trainer.bottleneck import diagnose


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
    backpressured = diagnose(steps(**{"perf/step_s": 3.0, "perf/rollout_wait_s": 0.0, "rollout/backpressure_s": 1.5,
                                      "sample/rollout_queue_size": 64}))
    assert backpressured.kind == "trainer-bound"
    assert "token_budget" in backpressured.line and "gradient_checkpointing" in backpressured.line
    stale = diagnose(steps(**{"perf/step_s": 3.0, "perf/rollout_wait_s": 0.1, "sample/dropped_stale_total": 40}))
    assert stale.kind == "trainer-bound" and "40 stale samples dropped" in stale.line


def test_neither_waiting_nor_backpressure_is_balanced():
    verdict = diagnose(steps(**{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.05}))
    assert verdict.kind == "balanced"


def test_callback_reports_every_n_steps_and_keeps_a_final_verdict(caplog):
    import logging
    from types import SimpleNamespace

    from agrpo.trainer.trl_backend import BottleneckCallback

    callback = BottleneckCallback(every=2)
    with caplog.at_level(logging.INFO, logger="agrpo.trainer.trl_backend"):
        for step in range(1, 6):
            callback.on_log(None, SimpleNamespace(global_step=step), None,
                            logs={"perf/step_s": 1.0, "perf/rollout_wait_s": 0.8})
        callback.on_log(None, SimpleNamespace(global_step=6), None, logs={"loss": 0.0})  # not a step log
        callback.on_train_end(None, SimpleNamespace(global_step=5), None)
    lines = [r.getMessage() for r in caplog.records if "bottleneck" in r.getMessage()]
    assert len(lines) == 3  # steps 1-2, steps 3-4, whole run
    assert "steps 1-2" in lines[0] and "whole run" in lines[-1]
    assert callback.final.kind == "generation-bound"
