"""What a run of the own tool task writes, read back without vLLM: episodes played from its model (the warm start)
and its final adapter with transformers' sampling, as the rollout loop plays them (agrpo/eval/episodes.py), on
the task's held-out rows. Printed: the reward (numeric_match) and the replies that opened a tool call TRL could not
parse, against every reply that opened one, with their reasons (agrpo/agents/malformed.py) and a few of them as the
model wrote them. `--adapter none` samples the model alone; `--force-call` opens every first turn with the call tag
(what the model writes once it calls: the format the warm start taught). No vLLM, no lock; ~1 minute for 160 episodes
of the tiny model on one core.

    python benchmarks/own_tool_task/run.py --keep trainer.seed=1       # prints its task folder
    python benchmarks/own_tool_task/sample_calls.py TASK_FOLDER [--temperature 1.0] [--adapter none] [--force-call]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from agrpo.agents.malformed import REASONS, malformed_reason

OPENER = "<tool_call>"  # the qwen2_5 template's (the recipe's chat template)


def load(folder: Path, adapter: str) -> tuple[Any, Any, Any]:
    """(the run's config, its tokenizer with TRL's response schema, its model with the adapter unless 'none')."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    from agrpo.models.chat_template import resolve_chat_template

    cfg = OmegaConf.load(folder / "run" / "config.yaml")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    if cfg.model.chat_template:
        tokenizer.chat_template = resolve_chat_template(cfg.model.chat_template)
    tokenizer = add_response_schema(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, dtype=torch.float32)
    path = folder / "run" / "final_adapter" if adapter == "final" else Path(adapter)
    if adapter != "none":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(path))
    return cfg, tokenizer, model.eval()


class Sampler:
    """`complete(prompt_ids, seed)` for AgentEpisodes.play, by model.generate; notes why each unparsed call failed."""

    def __init__(self, tokenizer: Any, model: Any, max_tokens: int, temperature: float, force_call: bool):
        self.tokenizer, self.model, self.max_tokens, self.temperature = tokenizer, model, max_tokens, temperature
        self.force = tokenizer.encode(OPENER, add_special_tokens=False) if force_call else []
        self.counts: Counter = Counter()
        self.examples: dict[str, list[str]] = {}
        self.first = True  # the next turn is an episode's first

    def __call__(self, prompt_ids: list[int], seed: int) -> dict:
        import torch
        from trl.chat_template_utils import parse_response

        torch.manual_seed(seed)
        forced = self.force if self.first else []
        self.first = False
        ids = torch.tensor([prompt_ids + forced])
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=self.temperature, top_k=0,
            top_p=1.0, max_new_tokens=self.max_tokens - len(forced), pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )  # fmt: skip
        turn = forced + out[0, len(prompt_ids) + len(forced) :].tolist()
        eos = self.tokenizer.eos_token_id
        turn = turn[: turn.index(eos) + 1] if eos in turn else turn
        text = self.tokenizer.decode(turn, skip_special_tokens=False)
        if OPENER in text:
            self.counts["opened"] += 1
            if not parse_response(self.tokenizer, turn, prefix=prompt_ids).get("tool_calls"):
                reason = malformed_reason(text, re.compile(re.escape(OPENER)))
                self.counts[reason] += 1
                self.examples.setdefault(reason, []).append(text)
        return {"token_ids": turn, "finish_reason": "stop" if eos in turn else "length"}


def sample(folder: Path, args: argparse.Namespace) -> tuple[float, int, Sampler]:
    """(mean reward, episodes, the sampler with its counts) over the first `args.rows` held-out rows, k each."""
    import torch

    from agrpo.agents.build import Agent
    from agrpo.eval.episodes import AgentEpisodes
    from agrpo.rewards.generic import numeric_match

    torch.set_num_threads(1)
    cfg, tokenizer, model = load(folder, args.adapter)
    sampler = Sampler(tokenizer, model, cfg.trainer.max_completion_length, args.temperature, args.force_call)
    episodes = AgentEpisodes(Agent.from_config(cfg.agent), tokenizer, {})
    rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()[: args.rows]]
    rewards = []
    with torch.no_grad():
        for index, row in enumerate(rows):
            for j in range(args.k):
                sampler.first = True
                prompt = [{"role": "user", "content": row["prompt"]}]
                episode = episodes.play(sampler, {**row, "prompt": prompt}, 1000 * index + j)
                rewards.append(numeric_match([episode.messages], answer=[row["answer"]])[0] or 0.0)
    return sum(rewards) / max(1, len(rewards)), len(rewards), sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the task folder run.py --keep printed")
    parser.add_argument("--adapter", default="final", help="'final' (the run's), 'none', or a folder")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--k", type=int, default=4, help="episodes per row")
    parser.add_argument("--force-call", action="store_true", help="open every first turn with the call tag")
    parser.add_argument("--examples", type=int, default=3, help="unparsed replies printed per reason")
    args = parser.parse_args()
    folder = args.folder.resolve()
    os.chdir(folder)  # the run's tools are named relative to its folder (units.py:convert)
    reward, episodes, sampler = sample(folder, args)
    counts, opened = sampler.counts, sampler.counts["opened"]
    bad = sum(counts[reason] for reason in REASONS)
    reasons = "".join(f"; {reason} {counts[reason]}" for reason in REASONS if counts[reason])
    print(f"own tool task, {folder.name}, adapter {args.adapter}, temperature {args.temperature}:")
    print(f"  reward (numeric_match) {reward:.3f} over {episodes} episodes")
    print(f"  unparseable tool calls / replies opening one: {bad}/{opened} ({bad / max(1, opened):.1%}{reasons})")
    for reason, texts in sampler.examples.items():
        for text in texts[: args.examples]:
            print(f"  {reason}: {text!r}")


if __name__ == "__main__":
    main()
