"""The fixed sets of names a config value may take, one StrEnum per choice field.

A member is a `str` whose text is its value and whose name is that text too: OmegaConf converts YAML and overrides by
member name, `OmegaConf.to_yaml` writes the name, `json.dumps` and f-strings write the value, and code comparing
`cfg.sync.mode == "background"` keeps working. The validation pass reads these sets for its messages
(agrpo/config/ranges.py and friends), and the modules that act on a choice import them from here.
"""

from __future__ import annotations

from enum import StrEnum


class Choice(StrEnum):
    """A config value that is one of a fixed set of names."""

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The names, as plain strings, in the order the schema declares them (messages list them so)."""
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls, text: object) -> Choice | None:
        """The member named `text`, or None when it names none."""
        try:
            return cls(str(text))
        except ValueError:
            return None


class SyncMode(Choice):
    """sync.mode (agrpo/trainer/sync/background.py)."""

    background = "background"
    blocking = "blocking"


class Attention(Choice):
    """trainer.attention (agrpo/config/attention_choice.py)."""

    auto = "auto"
    fa3 = "fa3"
    sdpa = "sdpa"


class Device(Choice):
    """inference.device."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Role(Choice):
    """role: what `python -m agrpo` starts."""

    all = "all"
    trainer = "trainer"


class ModelDtype(Choice):
    """model.dtype: the trainer's precision, as transformers' `dtype` takes it."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ServedDtype(Choice):
    """inference.dtype: vLLM's `--dtype` names."""

    auto = "auto"
    half = "half"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float = "float"
    float32 = "float32"


class LogLevel(Choice):
    """logger.level and inference.log_level: Python's logging levels, in any case (`info` is INFO)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        upper = str(value).upper()
        return next((member for member in cls if member.value == upper), None)


class TrainerLauncher(Choice):
    """launcher.hf_jobs.trainer_launcher: what starts the proxy and the trainer inside the trainer Job."""

    local = "local"
    accelerate = "accelerate"


class MixedPrecision(Choice):
    """launcher.accelerate.mixed_precision: accelerate's names."""

    no = "no"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
