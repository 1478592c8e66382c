"""Is every request served with the adapter it names while many tenants' versions churn through a replica's slots?

    flock /tmp/agrpo-dev-vllm.lock python benchmarks/lora_churn_check.py [--tenants 4] [--versions 12]
        [--url URL --model DIR]   # an existing replica of DIR instead of one booted like a shared fleet's

A shared fleet (docs/shared_fleet.md) serves several runs' adapters from one replica: every run loads a new version
each step and retires old ones, so versions pass through vLLM's LoRA slots (`--max-loras`) and its CPU cache
(`--max-cpu-loras`) while other tenants' requests are still decoding. vLLM had a bug there (vllm#47724: after a
runtime load, an in-flight request was decoded with another adapter); a run hit by it would train on samples whose
logprobs belong to another policy (TRL's `kl` jumps).

This check plays that traffic and then recomputes, with peft on the trainer's side, the logprob of every token vLLM
sampled under the adapter the request named. Tenants have ranks 1, 4, 8, 16 (cycled) with alpha 32, as the smoke
sweep's points; version v of a tenant is its random adapter moved v steps along a random direction. Each tenant, in
its own thread: load v, send `--requests` completions naming it (sampled, temperature 1), unload v-2, wait for half
of them (the other half decode across the next load). Booted here, the replica is sized like a 4-tenant fleet
(`--max-lora-rank 16 --max-loras 12 --max-cpu-loras 24`).

Prints per tenant: completions, TRL's kl estimator (mean of (r - 1) - log r, r the peft/vLLM probability ratio)
against the named version (0 when served as named) and, as the control that shows the check can fail, against the
version before it. Exits 1 when a completion's kl against its named version exceeds `--tolerance`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import sys
import tempfile
from pathlib import Path

import requests
import torch

ALPHA = 32
RANKS = (1, 4, 8, 16)
PROMPTS = ("Write ten words in lowercase:", "Name five colours:", "Count to nine:", "Say something short:")


def build_versions(model_dir: Path, out: Path, tenants: int, versions: int, max_rank: int) -> dict[int, list[Path]]:
    """`versions` adapter folders per tenant: a random rank-r adapter (r from RANKS, capped at `max_rank`) moved one
    random step per version, so consecutive versions differ as one training step's would."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    folders: dict[int, list[Path]] = {}
    for tenant in range(tenants):
        rank = min(RANKS[tenant % len(RANKS)], max_rank)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(model_dir),
            LoraConfig(r=rank, lora_alpha=ALPHA, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        lora_b = [param for name, param in model.named_parameters() if "lora_B" in name]
        with torch.no_grad():
            for param in lora_b:
                param.normal_(std=0.02)
            step = [torch.randn_like(param) * 0.01 for param in lora_b]
            for version in range(1, versions + 1):
                for param, delta in zip(lora_b, step):
                    param.add_(delta)
                path = out / f"t{tenant}" / f"trl-policy-v{version}"
                model.save_pretrained(path)
                folders.setdefault(tenant, []).append(path)
    return folders


def sample(url: str, name: str, prompt: list[int], seed: int, max_tokens: int) -> dict:
    """One sampled completion of `prompt` under adapter `name`, with the logprob vLLM gave each sampled token."""
    body = {
        "model": name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "logprobs": 0,
        "seed": seed,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    response = requests.post(f"{url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    logprobs = response.json()["choices"][0]["logprobs"]
    tokens = [int(token.split(":", 1)[1]) for token in logprobs["tokens"]]
    return {"prompt": prompt, "tokens": tokens, "logprobs": logprobs["token_logprobs"]}


def play_tenant(url: str, tenant: int, folders: list[Path], prompts: list[list[int]], args) -> list[dict]:
    """One tenant's traffic: load a version, sample from it, retire the version two back, leave half in flight."""
    done: list[dict] = []
    with futures.ThreadPoolExecutor(args.requests) as pool:
        pending: list[tuple[int, futures.Future]] = []
        for version, folder in enumerate(folders, start=1):
            name = f"t{tenant}-churn/trl-policy-v{version}"
            load = {"lora_name": name, "lora_path": str(folder)}
            requests.post(f"{url}/v1/load_lora_adapter", json=load, timeout=120).raise_for_status()
            for i in range(args.requests):
                seed = tenant * 100_000 + version * 100 + i
                pending.append((version, pool.submit(sample, url, name, prompts[i % len(prompts)], seed, args.tokens)))
            if version > 2:
                retire = {"lora_name": f"t{tenant}-churn/trl-policy-v{version - 2}"}
                requests.post(f"{url}/v1/unload_lora_adapter", json=retire, timeout=120)
            keep = args.requests // 2
            for version_of, future in pending[:-keep] if keep else pending:
                done.append({"tenant": tenant, "version": version_of, **future.result()})
            pending = pending[-keep:] if keep else []
        done += [{"tenant": tenant, "version": v, **future.result()} for v, future in pending]
    return done


def kl_estimate(reference: torch.Tensor, served: torch.Tensor) -> float:
    """TRL's per-token kl estimator (async_grpo_trainer: (r - 1) - log r, r = exp(reference - served)), averaged."""
    log_ratio = reference - served
    return float(((torch.exp(log_ratio) - 1) - log_ratio).mean())


def peft_kls(model_dir: Path, folders: dict[int, list[Path]], records: list[dict], shift: int) -> list[float | None]:
    """For each record, the kl of vLLM's sampled-token logprobs against peft's under version (named - shift)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    kls: list[float | None] = [None] * len(records)
    wanted: dict[Path, list[int]] = {}
    for index, record in enumerate(records):
        if record["version"] - shift >= 1:
            wanted.setdefault(folders[record["tenant"]][record["version"] - shift - 1], []).append(index)
    for folder, indices in wanted.items():
        model = PeftModel.from_pretrained(base, folder).eval()
        for index in indices:
            record = records[index]
            ids = record["prompt"] + record["tokens"]
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            start = len(record["prompt"]) - 1
            reference = torch.stack([logprobs[start + i, token] for i, token in enumerate(record["tokens"])])
            kls[index] = kl_estimate(reference, torch.tensor(record["logprobs"], dtype=torch.float32))
        base = model.unload()
    return kls


def report(records: list[dict], named: list[float | None], behind: list[float | None], ranks: list[int]) -> None:
    """The table: per tenant, its rank, completions, kl against the named version and against the one before."""
    print("| tenant | rank | completions | kl vs named version: mean / max | kl vs the version before: mean |")
    print("|---|---|---|---|---|")
    for tenant, rank in enumerate(ranks):
        mine = [i for i, record in enumerate(records) if record["tenant"] == tenant]
        as_named = [named[i] for i in mine if named[i] is not None]
        previous = [behind[i] for i in mine if behind[i] is not None]
        print(
            f"| t{tenant} | {rank} | {len(mine)} | {sum(as_named) / len(as_named):.5f} / {max(as_named):.5f} "
            f"| {sum(previous) / max(1, len(previous)):.4f} |"
        )


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--versions", type=int, default=12, help="versions each tenant loads, one after another")
    parser.add_argument("--requests", type=int, default=4, help="completions per version")
    parser.add_argument("--tokens", type=int, default=16, help="sampled tokens per completion")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest kl vs the named version that passes")
    parser.add_argument("--url", help="an existing replica (its --max-lora-rank must hold the ranks: --max-rank)")
    parser.add_argument("--model", help="the replica's model folder (with --url); built here otherwise")
    parser.add_argument("--max-rank", type=int, default=16, help="cap on the tenants' ranks (the replica's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lora-churn-"))
    replica = None
    if args.url:
        url, model_dir = args.url.rstrip("/"), Path(args.model)
    else:
        from agrpo.inference.vllm_server import start_replica
        from agrpo.models.tiny import build_tiny_model

        model_dir = build_tiny_model(work / "tiny-qwen2")
        replica = start_replica(model_dir, 18991, work / "vllm.log", lora_rank=16, max_loras=12, max_model_len=256,
                                extra_args=["--max-cpu-loras", "24"])  # fmt: skip
        url = replica.url
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
        folders = build_versions(model_dir, work / "adapters", args.tenants, args.versions, args.max_rank)
        with futures.ThreadPoolExecutor(args.tenants) as pool:  # the tenants at once; results read in this thread
            played = [pool.submit(play_tenant, url, t, folders[t], prompts, args) for t in folders]
            records = [record for future in played for record in future.result()]
    finally:
        if replica is not None:
            replica.stop()
    named, behind = peft_kls(model_dir, folders, records, 0), peft_kls(model_dir, folders, records, 1)
    ranks = [min(RANKS[t % len(RANKS)], args.max_rank) for t in range(args.tenants)]
    report(records, named, behind, ranks)
    worst = max(kl for kl in named if kl is not None)
    print(f"served as named: {len(records)} completions, worst kl {worst:.6f} (tolerance {args.tolerance})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
