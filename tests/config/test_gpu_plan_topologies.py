"""Every GPU plan agrpo accepts fits, and every refusal's advice, applied, is accepted and fits (issue 45).

Simulated machines (no GPU here): 1x24 GB (A10G), 1x48 GB (L40S), 1x80 GB, 2x80 GB and 8x80 GB (H100), each GPU's
memory as nvidia-smi reports it. For the gsm8k and smoke recipes, with one replica, `inference.replicas=2`, `auto`,
explicit `inference.gpus` / `trainer.gpus` and `launcher=accelerate`: the planner's verdict (agrpo/config/gpu_advice.py,
what the validation pass refuses) decides; an accepted case's REAL local plan is built (agrpo/launchers/local.py, as
the dry run prints it) and its GPUs and `--gpu-memory-utilization` flags are summed against agrpo's estimates, so a
planner that drifted from the launcher fails here. A refusal's advice is applied mechanically (composed as command-line
overrides), must pass the config-only validation and the planner, and its plan must fit the same way.
"""

from __future__ import annotations

import functools

import pytest
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.config.gpu_advice import Machine, verdict
from agrpo.config.gpu_plan import REPLICA_OUTSIDE_GIB, needs_of
from agrpo.config.memory_estimate import GIB
from agrpo.config.prepare import prepare
from agrpo.launchers.local import build_local_plan

MIB = 1024**2
MACHINES = {
    "1x24GB": Machine(1, 23028 * MIB, "NVIDIA A10G"),
    "1x48GB": Machine(1, 46068 * MIB, "NVIDIA L40S"),
    "1x80GB": Machine(1, 81559 * MIB, "NVIDIA H100 80GB HBM3"),
    "2x80GB": Machine(2, 81559 * MIB, "NVIDIA H100 80GB HBM3"),
    "8x80GB": Machine(8, 81559 * MIB, "NVIDIA H100 80GB HBM3"),
}
QWEN2_5_0_5B = {  # the gsm8k recipe's model, its published config.json values (nothing is downloaded)
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
TINY = {  # the smoke recipe's model as agrpo/models/tiny.py builds it (its byte-level vocabulary rounded up)
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}
RECIPES = {"gsm8k": QWEN2_5_0_5B, "smoke": TINY}
VARIANTS = {
    "one replica": (),
    "replicas=2": ("inference.replicas=2",),
    "auto": ("inference.replicas=auto",),
    "auto 1..3": ("inference.replicas=auto", "inference.max_replicas=3"),
    "explicit [0,0] + trainer [0]": ("inference.replicas=2", "inference.gpus=[0,0]", "trainer.gpus=[0]"),
    "explicit trainer [0], replica [0]": ("inference.gpus=[0]", "trainer.gpus=[0]"),
    "replica share 0.6": ("inference.gpu_memory_utilization=0.6",),
    "accelerate": ("launcher=accelerate",),
}


@functools.cache
def variant_config(recipe: str, overrides: tuple[str, ...]):
    return compose_run_config([f"+recipe={recipe}", *overrides], output_dir="/runs/r1")


def composed(recipe: str, overrides: tuple[str, ...], advice: tuple[str, ...] = ()):
    """The case as the CLI composes it, with a refusal's advice applied as command-line `key=value` overrides are
    (composing each again through Hydra would cost ~1 s a case)."""
    cfg = variant_config(recipe, overrides)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(advice))) if advice else cfg


def plan_fits(recipe: str, overrides: tuple[str, ...], machine: Machine, advice: tuple[str, ...] = ()) -> None:
    """Build the real local plan of an accepted case and sum each GPU's processes against the estimates."""
    cfg = composed(recipe, overrides, advice)
    spec = prepare(cfg, check_environment=False, cuda_available=True)  # config-only validation, then resolve
    plan = build_local_plan(spec, "/runs/r1", "cuda", machine.count, range(16), python="py")
    replicas = [s for s in plan.services if s.role == "replica"] + (plan.fleet.spares if plan.fleet else [])
    needs = needs_of(cfg, RECIPES[recipe], machine.bf16)
    used: dict[int, float] = {}
    for replica in replicas:
        fraction = float(replica.argv[replica.argv.index("--gpu-memory-utilization") + 1])
        assert fraction * machine.memory >= needs.replica, (overrides, fraction)
        for gpu in replica.gpus:
            used[int(gpu)] = used.get(int(gpu), 0.0) + fraction * machine.memory + REPLICA_OUTSIDE_GIB * GIB
    assert plan.trainer.gpus, "the trainer must get a GPU"
    for gpu in plan.trainer.gpus:
        used[int(gpu)] = used.get(int(gpu), 0.0) + needs.trainer
    over = {gpu: round(b / GIB, 1) for gpu, b in used.items() if b > machine.memory}
    assert not over, f"{recipe} {overrides} on {machine}: GPUs over {machine.memory / GIB:.1f} GiB: {over}"


CASES = [(r, v, m) for r in RECIPES for v in VARIANTS for m in MACHINES]


@pytest.mark.parametrize(("recipe", "variant", "machine"), CASES)
def test_accepted_plans_fit_and_every_refusals_advice_is_accepted_and_fits(recipe, variant, machine):
    overrides, gpus = VARIANTS[variant], MACHINES[machine]
    found = verdict(composed(recipe, overrides), gpus, RECIPES[recipe])
    if not found.problems:
        plan_fits(recipe, overrides, gpus)
        return
    assert found.advice, found.text()
    for advice in found.advice:
        assert f"`{' '.join(advice)}`" in found.text()  # what the user reads is what is applied here
        again = verdict(composed(recipe, overrides, advice), gpus, RECIPES[recipe])
        assert not again.problems, (advice, again.text())
        plan_fits(recipe, overrides, gpus, advice)


EXPECTED = {  # (recipe, variant, machine): accepted as is (the rest are refused with advice)
    ("gsm8k", "one replica", "1x80GB"),
    ("gsm8k", "one replica", "2x80GB"),
    ("gsm8k", "replicas=2", "8x80GB"),
    ("gsm8k", "auto", "8x80GB"),
    ("smoke", "one replica", "1x24GB"),
    ("smoke", "explicit [0,0] + trainer [0]", "1x24GB"),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_the_decisions_a_user_meets_first(case):
    recipe, variant, machine = case
    assert not verdict(composed(recipe, VARIANTS[variant]), MACHINES[machine], RECIPES[recipe]).problems


def test_the_issues_out_of_memory_plan_is_refused_with_advice_that_fits():
    """inference.gpus=[0,0] trainer.gpus=[0] on one 80 GB GPU (gsm8k): two replicas at 0.35 beside ~35 GiB."""
    found = verdict(composed("gsm8k", VARIANTS["explicit [0,0] + trainer [0]"]), MACHINES["1x80GB"], QWEN2_5_0_5B)
    assert "GPU 0 (NVIDIA H100 80GB HBM3, 79.6 GiB) would hold 2 replica(s) at 0.35 + 0.35" in found.text()
    assert "16,384 tokens a micro-step" in found.text()
    assert ("trainer.gradient_checkpointing=true",) in found.advice


@pytest.mark.parametrize("machine", ["1x24GB", "1x48GB"])
def test_gsm8k_as_shipped_does_not_fit_one_gpu_under_80_gb(machine):
    found = verdict(composed("gsm8k", ()), MACHINES[machine], QWEN2_5_0_5B)
    assert found.problems and any("trainer.gradient_checkpointing=true" in " ".join(a) for a in found.advice)


def test_an_auto_fleet_refused_on_one_gpu_names_max_replicas():
    found = verdict(composed("gsm8k", ("inference.replicas=auto",)), MACHINES["1x80GB"], QWEN2_5_0_5B)
    assert "inference.max_replicas=2 slots" in found.text()
    assert ("inference.max_replicas=1",) in found.advice
    assert not any("inference.replicas=" in part for advice in found.advice for part in advice)


def test_without_a_config_json_the_placement_is_still_checked():
    """No model estimate (offline, not cached): GPU fractions and counts are still summed."""
    over = verdict(composed("gsm8k", ("inference.replicas=3", "inference.gpus=[0,0,0]")), MACHINES["1x80GB"], None)
    assert over.problems and "3 replica(s) at 0.35 + 0.35 + 0.35" in over.text()  # 1.05 of the GPU, and 3 GiB
    base = ("inference.replicas=3", "inference.gpus=[0,0,0]")
    assert over.advice and all(
        not verdict(composed("gsm8k", base, advice), MACHINES["1x80GB"], None).problems for advice in over.advice
    )
