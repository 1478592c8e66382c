"""Resolve once: the spec holds what each rule derives, and nothing left to derive."""

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.resolve import derived_values, resolve
from agrpo.config.schema import TrainerConfig
from agrpo.config.spec import spec_yaml

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
def test_the_spec_holds_each_rules_value(overrides, cuda):
    """Each derived value is its rule's (agrpo/config/resolve.py), applied once to the composed config."""
    from agrpo.config.resolve import queue_size, served_lora_rank, served_max_loras, uses_proxy
    from agrpo.config.resolve import served_device as resolve_device

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
    text = spec_yaml(resolved).replace("max_inflight_tasks: auto", "")  # the controller's, at run time
    assert "${" not in text and "auto" not in text
    assert resolved.trainer.token_budget == 0  # the recipe's own value is kept
    assert resolved.eval.max_tokens == resolved.trainer.max_completion_length == 16
    assert resolved.trainer.max_inflight_tasks == "auto"
    assert resolved.trainer.queue_maxsize == 16 * 1 * 1  # the controller's ceiling: C x W x max(S, 1)
    assert resolved.trainer.inflight_slots == 16  # the same ceiling: TRL's slots and the fleet's plan read it
    fixed = resolve(composed(["+recipe=smoke", "trainer.max_inflight_tasks=7"]), cuda_available=False)
    assert fixed.trainer.inflight_slots == 7 and fixed.trainer.queue_maxsize == 14
    assert type(resolved.trainer) is TrainerConfig  # the schema's own (frozen) class


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
