"""The packed-attention choice (agrpo/config/attention_choice.py) and its SDPA kernel (agrpo/trainer/seam/attention.py),
simulated for every condition on this CPU machine: the pure decision for each GPU, precision, package, cache and Hub state; the facts read from a simulated CUDA device
and a kernel cache laid out as `kernels` leaves it; the SDPA stand-in staying on the queries' device. The CLI's
refusal of a forced `trainer.attention=fa3` here is in tests/config/test_vllm_checks.py (one CLI run, both checks)."""

from __future__ import annotations

import pytest
import torch

from agrpo.config import attention_choice
from agrpo.config.attention_choice import AttentionFacts, choose_attention, fa3_blockers, gather_facts, kernel_in_cache
from agrpo.config.schema import RunConfig
from agrpo.config.spec import with_values
from agrpo.trainer.seam import attention

H100 = dict(cuda=True, capability=(9, 0), half_precision=True, kernels_installed=True)


@pytest.mark.parametrize(
    ("facts", "kind", "reason_has"),
    [
        (AttentionFacts(cuda=False), "sdpa", "no CUDA GPU"),
        (AttentionFacts(**H100, kernel_cached=True), "fa3", "cached kernel"),
        (AttentionFacts(**H100, hub_reachable=True), "fa3", "fetched from the Hub"),
        (AttentionFacts(**{**H100, "capability": (8, 0)}, kernel_cached=True), "fa3", "cached"),  # A100
        (AttentionFacts(**{**H100, "capability": (8, 9)}, kernel_cached=True), "fa3", "cached"),  # L4 runs sm_80 code
        (AttentionFacts(**{**H100, "capability": (7, 5)}, kernel_cached=True), "sdpa", "compute capability 7.5"),  # T4
        (
            AttentionFacts(**{**H100, "capability": (7, 0)}, kernel_cached=True),
            "sdpa",
            "compute capability 7.0",
        ),  # V100
        (AttentionFacts(**{**H100, "capability": (10, 0)}, kernel_cached=True), "sdpa", "capability 10.0"),  # B200
        (AttentionFacts(**{**H100, "capability": (9, 0)}, rocm=False, kernel_cached=True), "fa3", "cached"),
        (AttentionFacts(**{**H100, "half_precision": False}, kernel_cached=True), "sdpa", "fp32 queries"),
        (AttentionFacts(**{**H100, "kernels_installed": False}), "sdpa", "`kernels` package is not installed"),
        (AttentionFacts(**H100, hub_offline=True), "sdpa", "HF_HUB_OFFLINE"),
        (AttentionFacts(**H100, hub_reachable=False), "sdpa", "cannot be reached"),
        (AttentionFacts(**H100, kernel_cached=True, hub_offline=True), "fa3", "cached kernel"),  # offline, but cached
    ],
)
def test_auto_takes_fa3_exactly_where_it_can_run(facts, kind, reason_has):
    choice = choose_attention("auto", facts)
    assert choice.kind == kind
    assert reason_has in choice.reason
    assert choice.problem is None  # auto never refuses: it falls back
    assert ("FlashAttention-3" if kind == "fa3" else "SDPA packed attention") in choice.banner


def test_every_blocker_is_named_at_once():
    facts = AttentionFacts(cuda=True, capability=(7, 5), half_precision=False, kernels_installed=False)
    blockers = fa3_blockers(facts)
    assert len(blockers) == 3 and "7.5" in blockers[0] and "fp32" in blockers[1] and "kernels" in blockers[2]


def test_forced_fa3_where_it_cannot_run_is_a_problem_naming_the_key_and_the_reason():
    choice = choose_attention("fa3", AttentionFacts(**H100, hub_offline=True))
    assert choice.problem is not None
    assert choice.problem.startswith("trainer.attention=fa3 cannot run here")
    assert "HF_HUB_OFFLINE" in choice.problem and "trainer.attention=auto" in choice.problem


def test_forced_choices_that_can_run():
    assert choose_attention("fa3", AttentionFacts(**H100, kernel_cached=True)).kind == "fa3"
    forced = choose_attention("sdpa", AttentionFacts(**H100, kernel_cached=True))
    assert (forced.kind, forced.problem) == ("sdpa", None)
    assert "trainer.attention=sdpa" in forced.banner
    assert choose_attention("flash", AttentionFacts(cuda=False)).problem.startswith("trainer.attention='flash'")


def cfg(**trainer):
    return with_values(RunConfig(), {"model.name_or_path": "m", **trainer})


@pytest.mark.parametrize(
    ("overrides", "cuda", "half"),
    [
        ({}, True, True),  # trainer.bf16=None: bf16 autocast on a GPU
        ({}, False, False),  # ... and fp32 on CPU
        ({"trainer.bf16": False}, True, False),
        ({"trainer.bf16": False, "model.dtype": "bfloat16"}, True, True),
        ({"trainer.bf16": False, "trainer.extra": {"fp16": True}}, True, True),
    ],
)
def test_query_precision_follows_bf16_fp16_and_model_dtype(overrides, cuda, half):
    assert attention_choice.queries_in_half_precision(cfg(**overrides), cuda) is half


def write_kernel_cache(root, layout="kernels", version=1, snapshot=True):
    folder = root / f"{layout}--kernels-community--flash-attn3"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / f"v{version}").write_text("abc123\n")
    if snapshot:
        (folder / "snapshots" / "abc123").mkdir(parents=True)


@pytest.mark.parametrize(
    ("layout", "version", "snapshot", "cached"),
    [("kernels", 1, True, True), ("models", 1, True, True), ("kernels", 2, True, False), ("kernels", 1, False, False)],
)
def test_kernel_in_cache_reads_both_layouts_kernels_uses(tmp_path, layout, version, snapshot, cached):
    write_kernel_cache(tmp_path, layout, version, snapshot)
    assert kernel_in_cache(cache_dir=str(tmp_path)) is cached


def simulate_gpu(monkeypatch, capability, cache_dir, offline):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setenv("KERNELS_CACHE", str(cache_dir))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


def test_gather_facts_on_a_simulated_h100_probes_the_hub_only_when_it_decides(monkeypatch, tmp_path):
    import importlib.util

    has_kernels = importlib.util.find_spec("kernels") is not None
    probes = []
    simulate_gpu(monkeypatch, (9, 0), tmp_path, offline=False)
    facts = gather_facts(cfg(), probe_hub=lambda: probes.append(1) or False)
    assert (facts.cuda, facts.capability, facts.half_precision, facts.kernel_cached) == (True, (9, 0), True, False)
    assert facts.kernels_installed is has_kernels
    assert probes == ([1] if has_kernels else [])  # without `kernels` FA3 is ruled out before any probe
    assert choose_attention("auto", facts).kind == "sdpa"

    write_kernel_cache(tmp_path)
    probes.clear()
    facts = gather_facts(cfg(), probe_hub=lambda: probes.append(1) or False)
    assert facts.kernel_cached and probes == []  # cached: no network needed
    assert choose_attention("auto", facts).kind == ("fa3" if has_kernels else "sdpa")


def test_gather_facts_on_a_simulated_t4_never_probes(monkeypatch, tmp_path):
    simulate_gpu(monkeypatch, (7, 5), tmp_path, offline=False)
    facts = gather_facts(cfg(), probe_hub=lambda: pytest.fail("probed the Hub for a GPU the kernel cannot run on"))
    assert facts.hub_reachable is None and choose_attention("auto", facts).kind == "sdpa"


def test_sdpa_attention_keeps_its_mask_on_the_queries_device():
    """On a GPU the queries are on CUDA: a mask built on the CPU (as before) fails there. `meta` tensors stand in for
    another device: SDPA refuses a CPU mask for them exactly as CUDA would."""
    q, k, v = (torch.randn(n, h, 32, device="meta") for n, h in ((12, 4), (24, 2), (24, 2)))
    cu_q = torch.tensor([0, 6, 9, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 15, 24], dtype=torch.int32)
    out = attention.varlen_causal_attention(q, k, v, cu_q, cu_k, 6, 9)
    assert out.shape == (12, 4, 32) and out.device.type == "meta"


def test_trl_still_loads_the_kernel_the_choice_checks_for():
    """If TRL's packed attention moves to another kernel or version, the cache check would look for the wrong one."""
    import inspect

    from trl.experimental.async_grpo import packing

    source = inspect.getsource(packing)  # the module's text: agrpo may have replaced _flash_attn in this process
    assert f'get_kernel("{attention_choice.FA3_REPO}", version={attention_choice.FA3_VERSION})' in source
    assert f'get_kernel("{attention_choice.ROCM_REPO}", version={attention_choice.ROCM_VERSION})' in source


def test_the_banner_names_the_choice():
    from agrpo.trainer.console.callback import banner_lines

    choice = choose_attention("auto", AttentionFacts(cuda=False))
    lines = banner_lines(
        run_dir="r", model="m", lora_rank=8, max_steps=1, replicas=1, vllm_url=None, log_file=None, report_to=[],
        attention=choice.banner,
    )  # fmt: skip
    assert lines[2] == "  attention    SDPA packed attention (agrpo's; FA3 not usable: no CUDA GPU)"


def test_the_kernel_is_loaded_through_kernels_public_call_as_trl_names_it(monkeypatch):
    """agrpo loads FA3 with `kernels.get_kernel` (the repo and version TRL's private loader names: the test above),
    not through TRL's `packing._flash_attn`."""
    import sys
    import types

    asked = []
    kernel = types.SimpleNamespace(flash_attn_varlen_func=lambda *a: None)
    fake = types.ModuleType("kernels")
    fake.get_kernel = lambda repo, version: asked.append((repo, version)) or kernel
    monkeypatch.setitem(sys.modules, "kernels", fake)
    assert attention_choice.load_fa3_kernel() is kernel
    assert asked == [(attention_choice.FA3_REPO, attention_choice.FA3_VERSION)]
