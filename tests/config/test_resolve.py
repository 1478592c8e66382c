"""Resolve once: derived values match what today's consumers compute, and the resolved config holds no "derive me"."""

import pytest
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.config.resolve import derived_values, resolve

CASES = [
    ["+recipe=smoke"],
    ["+recipe=smoke", "inference.replicas=3", "lora.r=12", "trainer.max_staleness=2"],
    ["+recipe=gsm8k", "inference.replicas=2", "trainer.gradient_accumulation_steps=2"],
    ["+recipe=smoke", "trainer.max_inflight_tasks=7", "inference.max_loras=5", "inference.use_proxy=true"],
]


def composed(overrides):
    return compose_run_config(overrides, output_dir="/tmp/agrpo-resolve")


@pytest.mark.parametrize("overrides", CASES)
@pytest.mark.parametrize("cuda", [False, True])
def test_derived_values_agree_with_the_consumers(overrides, cuda):
    """Until every consumer reads the resolved file, the rules live twice: they must agree."""
    from agrpo.config.resolve import served_device as resolve_device
    from agrpo.config.resolve import served_lora_rank, served_max_loras
    from agrpo.launchers.local import uses_proxy
    from agrpo.config.resolve import queue_size

    cfg = composed(overrides)
    resolved = resolve(cfg, cuda_available=cuda)
    assert resolved.inference.device == resolve_device(cfg.inference.device, cuda)
    assert resolved.inference.max_lora_rank == served_lora_rank(cfg)
    assert resolved.inference.max_loras == served_max_loras(cfg)
    assert resolved.inference.use_proxy == uses_proxy(cfg)
    assert resolved.trainer.max_inflight_tasks == cfg.trainer.max_inflight_tasks  # auto is decided at run time
    assert resolved.trainer.queue_maxsize == queue_size(cfg.trainer)
    assert resolved.trainer.bf16 is cuda
    assert resolved.inference.dtype == ("bfloat16" if cuda else "float32")


def test_resolved_config_has_nothing_left_to_derive():
    resolved = resolve(composed(["+recipe=smoke"]), cuda_available=False)
    text = OmegaConf.to_yaml(resolved).replace("max_inflight_tasks: auto", "")  # the controller's, at run time
    assert "${" not in text and "auto" not in text
    assert resolved.trainer.token_budget == 0  # the recipe's own value is kept
    assert resolved.eval.max_tokens == resolved.trainer.max_completion_length == 16
    assert resolved.trainer.max_inflight_tasks == "auto"
    assert resolved.trainer.queue_maxsize == 16 * 1 * 1  # the controller's ceiling: C x W x max(S, 1)
    assert OmegaConf.get_type(resolved.trainer).__name__ == "TrainerConfig"  # still typed: unknown keys fail


def test_values_the_user_set_are_not_derived():
    cfg = composed(
        [
            "+recipe=smoke",
            "trainer.max_inflight_tasks=7",
            "trainer.queue_maxsize=9",
            "trainer.bf16=false",
            "inference.max_lora_rank=64",
            "inference.device=cpu",
            "inference.dtype=bfloat16",
        ]
    )
    derived = derived_values(cfg, cuda_available=True)
    assert not {
        "trainer.max_inflight_tasks",
        "trainer.queue_maxsize",
        "trainer.bf16",
        "inference.max_lora_rank",
        "inference.device",
        "inference.dtype",
    } & set(derived)
    assert resolve(cfg, cuda_available=True).trainer.queue_maxsize == 9
