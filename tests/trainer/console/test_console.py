"""The trainer's console: pure formatting on the metrics of a real 60-step smoke run (tests/report/data), the
logging routes (a real subprocess: terminal vs trainer.log), transformers' printing callbacks removed, and the
callback's line budget."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from agrpo.config.schema import RunConfig
from agrpo.config.spec import with_values
from agrpo.trainer.console.events import ConsoleEvents
from agrpo.trainer.console.notices import tool_calls_part
from agrpo.trainer.console.callback import (
    ConsoleCallback,
    banner_lines,
    eval_overrides,
    quiet_trainer,
    reward_lines,
    run_summary,
    serve_command,
    step_line,
    summary_lines,
)

HISTORY = json.loads((Path(__file__).parents[2] / "report" / "data" / "smoke_log_history.json").read_text())


def by_step(step):
    return next(e for e in HISTORY if e.get("step") == step and "reward" in e)


def test_step_line_of_a_real_step():
    line = step_line(by_step(3), 3, 60)
    assert line == ("step  3/60  reward 0.121 ± 0.078  kl 0.2962  len 15.3  0.26 s/step  stale 89%  sync 0.06 s")


def test_the_step_lines_tool_figure_is_the_logged_call_frequency():
    """Issue 46: the line said 0.10/episode where TensorBoard had 0.125. On a real agent run's steps, the window's
    started calls over its episodes (5 / 46 at step 1, 2 / 3 at step 2) differ from what TRL logged: the line shows
    the logged value."""
    agent = json.loads((Path(__file__).parents[2] / "report" / "data" / "agent_log_history.json").read_text())
    steps = [e for e in agent if "reward" in e and "step" in e][:6]
    assert any(f"{tool_calls_part(e).split()[1]}" != f"{e['tools/call_frequency']:.2f}/episode" for e in steps)
    for entry in steps:
        line = step_line(entry, entry["step"], 30)
        assert line.endswith(f"  tools {entry['tools/call_frequency']:.2f}/episode"), line
    assert step_line({"reward": 0.5, "tools/call_frequency": 0.125}, 1, 9).endswith("tools 0.12/episode")
    assert step_line({"reward": 0.5, "tools/call_frequency": 0.0}, 1, 9).endswith("tools 0.00/episode")
    assert "tools" not in step_line(by_step(3), 3, 60)  # not an agent run


def test_step_line_with_missing_metrics_shows_dashes_and_no_stale_drop_is_zero():
    assert "0.0" not in step_line({}, 1, 60).split("step")[1]  # nothing invented
    assert step_line({}, 1, 60) == "step  1/60  reward - ± -  kl -  len -  - s/step  stale -  sync - s"
    assert "stale 0%" in step_line(by_step(60), 60, 60)  # step 60 dropped nothing


def test_one_line_when_a_replica_hangs_and_one_when_it_is_back_none_for_one_that_died():
    events = ConsoleEvents()
    fine = {"proxy/replica0/healthy": 1.0, "proxy/replica0/hung": 0.0, "proxy/replica1/healthy": 1.0}
    assert events.observe({**fine, "proxy/replica1/hung": 0.0}, 10) == []
    stopped = {**fine, "proxy/replica1/healthy": 0.0, "proxy/replica1/hung": 1.0}
    [(level, line)] = events.observe(stopped, 11)
    assert level == logging.WARNING and line.startswith("replica 1 is hung (not answering its health probe)")
    assert line.endswith("training goes on without it")
    assert events.observe(stopped, 12) == [] and events.hung == {1: 11}  # said once
    [(level, line)] = events.observe({**fine, "proxy/replica1/hung": 0.0}, 30)
    assert level == logging.INFO
    assert line == "replica 1 answers again (hung since step 11): re-admitted with the current adapter"
    assert events.hung == {}
    died = {**fine, "proxy/replica1/healthy": 0.0, "proxy/replica1/hung": 0.0}  # refused: the launcher says it
    assert events.observe(died, 31) == [] and events.observe(fine | {"proxy/replica1/hung": 0.0}, 32) == []
    assert events.observe(by_step(3), 3) == []  # a one-replica run has no proxy figures


def test_run_summary_of_the_real_run():
    summary = run_summary(HISTORY)
    assert summary["steps"] == 60 and summary["runtime_s"] == 48.3577
    rewards = [e["reward"] for e in HISTORY if "reward" in e]
    assert summary["reward_first"] == pytest.approx(sum(rewards[:5]) / 5) == pytest.approx(0.1018, abs=1e-4)
    assert summary["reward_last"] == pytest.approx(0.9547, abs=1e-4)
    assert summary["steps_per_s"] == pytest.approx(60 / 48.3577)
    tokens = sum(e.get("batch/trained_tokens_per_step", 0) for e in HISTORY)
    assert summary["tokens_per_s"] == pytest.approx(tokens / 48.3577)
    assert summary["stale_share"] == pytest.approx(1176 / (1176 + 960))


def test_run_summary_without_train_runtime_sums_step_times():
    summary = run_summary(
        [{"reward": 0.5, "perf/step_s": 2.0, "step": 1}, {"reward": 0.7, "perf/step_s": 2.0, "step": 2}]
    )
    assert summary["runtime_s"] == 4.0 and summary["steps_per_s"] == 0.5 and summary["tokens_per_s"] is None
    assert summary["reward_first"] == summary["reward_last"] == pytest.approx(0.6)


def test_summary_lines_name_the_adapter_and_the_next_commands():
    lines = summary_lines(
        run_summary(HISTORY),
        run_dir="/runs/smoke/1",
        adapter="/runs/smoke/1/final_adapter",
        overrides=["+recipe=my task.yaml", "trainer.max_steps=60", "model=qwen2_5_0_5b"],
        serve="python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-0.5B-Instruct",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        weights={"lowercase_fraction": 1.0},
        repo_name="smoke-lora",
        verdict="trainer-bound (...)",
        curves="/runs/smoke/1/training_curves.png",
    )
    text = "\n".join(lines)
    assert lines[0] == "agrpo: done, 60 steps, final adapter in /runs/smoke/1/final_adapter (48 s of training)"
    assert lines[1] == "  reward       0.1018 (first 5 steps) -> 0.9547 (last 5 steps)"  # one term: said once
    assert "1.24 steps/s" in text and "55% of generated samples dropped as stale" in text
    assert "bottleneck   trainer-bound (...)" in text and "curves       /runs/smoke/1/training_curves.png" in text
    assert "agrpo eval '+recipe=my task.yaml' model=qwen2_5_0_5b eval.adapter=/runs/smoke/1/final_adapter" in text
    assert "agrpo push /runs/smoke/1 --repo-id smoke-lora --dry-run   # the card" in text
    assert "agrpo plot /runs/smoke/1" in text
    assert "  serve        python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-0.5B-Instruct" in text
    assert (
        "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B-Instruct'), "
        "'/runs/smoke/1/final_adapter')"
    ) in text
    assert sum(line.startswith("agrpo:") for line in lines) == 1  # one ending


def test_a_line_every_n_steps_the_first_step_and_after_a_quiet_minute():
    from agrpo.trainer.console.callback import line_due

    assert [s for s in range(1, 31) if line_due(s, 10, 5.0, 60.0)] == [1, 10, 20, 30]
    assert line_due(3, 10, 61.0, 60.0)  # a slow model: its pace shows within a minute, not after 10 long steps


def test_two_terms_are_shown_unweighted_and_as_they_add_up():
    history = [
        {"step": s, "reward": 0.1 * s, "rewards/numeric_match": 0.08 * s, "rewards/regex_match": 0.02 * s}
        for s in range(1, 11)
    ]
    lines = reward_lines(run_summary(history), {"numeric_match": 1.0, "regex_match": 0.2})
    assert lines == [
        "  reward       0.3000 (first 5 steps) -> 0.8000 (last 5 steps), the sum of each term x its weight:",
        "    numeric_match  0.2400 -> 0.6400 unweighted",
        "    regex_match    0.3000 -> 0.8000 unweighted, x 0.2 = 0.0600 -> 0.1600 in the sum",
    ]


def vllm_missing() -> str | None:
    import importlib.util

    return None if importlib.util.find_spec("vllm") else "vLLM is not installed (its own parser checks the line)"


@pytest.mark.requires(vllm_missing())
def test_the_serve_line_is_the_runs_own_replica_command_with_the_adapter(tmp_path):
    from agrpo.inference.vllm_server import build_replica_launch
    from tests.specs import spec_for

    cfg = spec_for("+recipe=smoke", output_dir=str(tmp_path), cuda=False)
    line = serve_command(cfg, "/runs/smoke/1/final_adapter", "cpu")
    launch = build_replica_launch(cfg, 8000, "cpu", python="python")
    assert line == (
        f"VLLM_CPU_KVCACHE_SPACE={cfg.inference.cpu_kvcache_gib} "
        + " ".join(launch.argv)
        + " --lora-modules smoke=/runs/smoke/1/final_adapter"
    )
    import shlex

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = shlex.split(line)
    served = argv[argv.index("vllm.entrypoints.openai.api_server") + 1 :]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(served)  # vLLM's own parser takes every flag
    assert args.enable_lora and [(m.name, m.path) for m in args.lora_modules] == [
        ("smoke", "/runs/smoke/1/final_adapter")
    ]


def test_eval_overrides_keep_what_says_the_task():
    assert eval_overrides(
        [
            "+recipe=gsm8k",
            "trainer.max_steps=5",
            "data=gsm8k",
            "logger.level=DEBUG",
            "lora.r=64",
            "reward=gsm8k",
            "model.name_or_path=/m",
            "inference.base_port=8661",
        ]
    ) == ["+recipe=gsm8k", "data=gsm8k", "lora.r=64", "reward=gsm8k", "model.name_or_path=/m"]


def test_banner_says_where_tensorboard_is():
    lines = banner_lines(
        run_dir="/r",
        model="tiny",
        lora_rank=8,
        max_steps=60,
        replicas=2,
        vllm_url="http://127.0.0.1:8000",
        log_file="/r/logs/trainer.log",
        report_to=["tensorboard", "wandb"],
    )
    assert lines[0] == "agrpo: training tiny (LoRA r=8) for 60 steps on 2 replica(s) behind http://127.0.0.1:8000"
    assert "  TensorBoard  /r/tensorboard  (tensorboard --logdir /r/tensorboard)" in lines
    assert "  full log     /r/logs/trainer.log" in lines and "  also logging to wandb" in lines


def test_quiet_trainer_removes_the_callbacks_that_print_metric_dicts():
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback, PrinterCallback, ProgressCallback

    handler = CallbackHandler([DefaultFlowCallback, ProgressCallback, PrinterCallback], None, None, None, None)
    trainer = SimpleNamespace(callback_handler=handler, remove_callback=handler.remove_callback)
    quiet_trainer(trainer)
    assert [type(c).__name__ for c in handler.callbacks] == ["DefaultFlowCallback"]


def config(**logger):
    values = {"sync.output_dir": "/runs/smoke/1", "run_name": "smoke", "model.name_or_path": "/models/tiny-qwen2"}
    return with_values(RunConfig(), {**values, **{f"logger.{key}": value for key, value in logger.items()}})


def drive(callback, history, max_steps):
    state = SimpleNamespace(is_world_process_zero=True, max_steps=max_steps, global_step=0)
    callback.on_train_begin(None, state, None)
    for entry in history:
        if "train_runtime" in entry:
            callback.on_log(None, state, None, logs=dict(entry))
            continue
        state.global_step = entry["step"]
        callback.on_step_end(None, state, None)
        callback.on_log(None, state, None, logs={k: v for k, v in entry.items() if k != "step"})
    callback.on_train_end(None, state, None)


def test_callback_prints_banner_a_line_every_n_steps_and_the_summary(caplog):
    callback = ConsoleCallback(config(console_every=20, progress_bar=False), num_replicas=1)
    with caplog.at_level(logging.INFO, logger="agrpo.console"):
        drive(callback, HISTORY, 60)
        printed = callback.print_summary("/runs/smoke/1/final_adapter")
    lines = [r.getMessage() for r in caplog.records if r.name == "agrpo.console"]
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/60", "20/60", "40/60", "60/60"]  # the first step too
    assert lines[0].startswith("agrpo: training") and lines[-len(printed) :] == printed
    assert len(lines) < 60  # well under one line per step, banner and summary included
    assert "agrpo: done, 60 steps, final adapter in /runs/smoke/1/final_adapter (48 s of training)" in printed


def test_callback_says_once_that_a_replica_hung_and_once_that_it_is_back(caplog):
    def health(entry):
        if "reward" not in entry:
            return entry
        hung = 20 <= entry["step"] < 30  # the proxy marked replica 1 hung at step 20, re-admitted it by step 30
        return {**entry, "proxy/replica1/healthy": float(not hung), "proxy/replica1/hung": float(hung)}

    callback = ConsoleCallback(config(console_every=0, progress_bar=False), num_replicas=2)
    with caplog.at_level(logging.INFO, logger="agrpo.console"):
        drive(callback, [health(entry) for entry in HISTORY], 60)
    lines = [r.getMessage() for r in caplog.records if r.name == "agrpo.console" and "replica 1" in r.getMessage()]
    assert [line.split(" (")[0] for line in lines] == ["replica 1 is hung", "replica 1 answers again"]
    assert "(hung since step 20)" in lines[1]


def test_the_summary_counts_the_samples_metrics_json_counts(caplog):
    """TRL's last log entry (train_runtime) can carry the rollout child's last counts, which no step entry has: the
    end summary prints the accounting metrics.json holds (the whole history's), not the steps' alone."""
    from agrpo.trainer.console.bottleneck import GENERATED, sample_accounting

    history = [{**entry, GENERATED: 16.0} for entry in HISTORY]  # the train_runtime entry too
    callback = ConsoleCallback(config(console_every=0, progress_bar=False), num_replicas=1)
    drive(callback, history, 60)
    accounting = sample_accounting(history)  # what trl_backend writes to metrics.json
    assert accounting["generated"] == 16 * 61
    with caplog.at_level(logging.INFO, logger="agrpo.console"):
        printed = callback.print_summary("/runs/smoke/1/final_adapter", samples=accounting)
    line = next(line for line in printed if "generated" in line and "used" in line)
    assert f"generated {16 * 61:,}, used {accounting['used']:,.0f}," in line


def test_callback_draws_one_bar_on_its_stream(tmp_path):
    stream = (tmp_path / "console.txt").open("w")
    callback = ConsoleCallback(config(console_every=0), stream=stream, bar=True)
    drive(callback, HISTORY[:10], 10)
    ConsoleCallback(config(console_every=0), stream=stream).on_train_begin(  # a file, not a terminal: no bar
        None, SimpleNamespace(is_world_process_zero=True, max_steps=5, global_step=0), None
    )
    stream.close()
    text = (tmp_path / "console.txt").read_bytes().decode()
    assert "10/10" in text and "reward 0.090" in text
    assert text.count("\n") == 1  # the bar redraws in place (carriage returns); one newline when it closes


CHILD = textwrap.dedent("""
    import logging, sys, warnings
    from agrpo.trainer.console.logs import setup_trainer_logging
    log_file = setup_trainer_logging(sys.argv[1], "INFO", stream=sys.stdout)
    logging.getLogger("trl.experimental.async_grpo.async_grpo_trainer").info("dropping stale sample (staleness=2)")
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
    from transformers.utils import logging as hf_logging
    hf_logging.get_logger("transformers.trainer_callback").warning(
        "You are adding a <class 'trl.experimental.async_grpo.async_grpo_trainer.StepIntervalCallback'> to the "
        "callbacks of this Trainer, but there is already one.")
    hf_logging.get_logger("transformers.trainer").warning("a real transformers warning")
    logging.getLogger("urllib3.connectionpool").warning("a real urllib3 warning")
    logging.getLogger("agrpo.console").info("agrpo console line")
    logging.getLogger("agrpo.trainer.cpu_compat").info("agrpo info line")
    logging.getLogger("agrpo.trainer.cpu_compat").warning("agrpo warning")
    logging.getLogger("agrpo.trainer.trl_backend").debug("agrpo debug detail")
    print(log_file)
""")


def run_logging_child(source: str, run_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    """`python -c source run_dir` in a fresh interpreter (logging set up from nothing, as in the trainer process),
    with this checkout importable and no inherited PYTHONWARNINGS."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-c", source, str(run_dir)], check=False, capture_output=True, text=True, env=env,
        timeout=timeout,
    )  # fmt: skip


def test_logging_routes_library_chatter_to_the_file_and_real_warnings_to_the_terminal(tmp_path):
    result = run_logging_child(CHILD, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    terminal = result.stdout.splitlines()
    assert terminal == [
        "WARNING transformers.trainer: a real transformers warning",
        "WARNING urllib3.connectionpool: a real urllib3 warning",
        "agrpo console line",
        "agrpo info line",
        "WARNING agrpo.trainer.cpu_compat: agrpo warning",
        str(tmp_path / "logs" / "trainer.log"),
    ]
    assert result.stderr == ""  # transformers' own stderr handler is gone
    log = (tmp_path / "logs" / "trainer.log").read_text()
    for text in (
        "dropping stale sample",
        "TRL currently supports vLLM versions",
        "StepIntervalCallback",
        "a real transformers warning",
        "a real urllib3 warning",
        "agrpo console line",
        "agrpo debug detail",
    ):
        assert text in log, text


def test_on_log_prints_a_run_notice_once_and_the_summary_says_no_learning_signal(caplog):
    """The run notices reach the console through on_log (agrpo/trainer/console/notices.py), and a run that ended without
    a learning signal is not called balanced at the end (agrpo/trainer/console/bottleneck.py: without_signal)."""
    from agrpo.trainer.console.bottleneck import diagnose, without_signal

    flat = [{**entry, "reward_std": 0.0} if "reward" in entry else entry for entry in HISTORY]
    callback = ConsoleCallback(config(console_every=0, progress_bar=False), num_replicas=1)
    with caplog.at_level(logging.INFO, logger="agrpo.console"):
        drive(callback, flat, 60)
    lines = [r.getMessage() for r in caplog.records if r.name == "agrpo.console"]
    said = [line for line in lines if "every episode of a prompt got the same reward" in line]
    assert len(said) == 1 and said[0].startswith("agrpo: for 5 steps"), lines
    reason = callback.notices.no_signal()
    assert reason == "reward spread 0 within every prompt's group in the last 60 steps"
    verdict = without_signal(diagnose([e for e in flat if "perf/step_s" in e]), reason)
    printed = callback.print_summary("/runs/smoke/1/final_adapter", verdict.line)
    line = next(line for line in printed if line.startswith("  bottleneck"))
    assert "no learning signal (reward spread 0" in line and "keep pace" not in line, line
    learnt = ConsoleCallback(config(console_every=0, progress_bar=False), num_replicas=1)
    drive(learnt, HISTORY, 60)
    assert learnt.notices.no_signal() is None  # the real smoke run had its spread
