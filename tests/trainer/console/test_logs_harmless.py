"""Issue 46: TRL's vLLM-version warning and transformers' "You are adding a StepIntervalCallback ... but there is
already one", made for real (TRL's weight_transfer module imported, TRL's two StepIntervalCallbacks added to a
transformers CallbackHandler as AsyncGRPOTrainer adds them), reach trainer.log once each with agrpo's reason, and the
terminal not at all. A real run before the change: trainer.log held the version warning twice (weight_transfer.py
lines 26 and 32, both in the trainer process; the rollout child's PYTHONWARNINGS drops its own) and the callback
warning raw; the terminal held neither."""

from __future__ import annotations

import textwrap

from agrpo.trainer.console.logs import HARMLESS, ONCE_IN_FILE
from tests.trainer.console.test_console import run_logging_child

CHILD = textwrap.dedent("""
    import logging, sys
    from agrpo.trainer.console.logs import setup_trainer_logging
    log_file = setup_trainer_logging(sys.argv[1], "INFO", stream=sys.stdout)
    import trl.experimental.async_grpo.weight_transfer  # TRL's vLLM range check, from two lines of the module
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback
    from trl.experimental.async_grpo.async_grpo_trainer import StepIntervalCallback
    handler = CallbackHandler([DefaultFlowCallback], None, None, None, None)
    handler.add_callback(StepIntervalCallback(print, 4))  # as AsyncGRPOTrainer: weight sync ...
    handler.add_callback(StepIntervalCallback(print, 1))  # ... and per-step metrics
    logging.getLogger("transformers.trainer").warning("a real transformers warning")
    print(log_file)
""")


def test_known_harmless_warnings_are_kept_once_in_trainer_log_with_the_reason(tmp_path):
    result = run_logging_child(CHILD, tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "WARNING transformers.trainer: a real transformers warning",
        str(tmp_path / "logs" / "trainer.log"),
    ]
    log = (tmp_path / "logs" / "trainer.log").read_text()
    reasons = {text: why for _name, text, why in HARMLESS}
    for text in ("TRL currently supports vLLM versions", "but there is already one"):
        assert log.count(text) == 1, (text, log)
    for text in ONCE_IN_FILE & {"TRL currently supports vLLM versions", next(t for t in reasons if "StepInt" in t)}:
        assert log.count(f"agrpo: known harmless, kept once in this log: {reasons[text]}") == 1, text
    assert "one syncing the weights every trainer.weight_sync_steps" in log
    assert log.count("agrpo: known harmless") == 2 + ("Triton is installed, but" in log)
