"""The agent_smoke model: the tiny Qwen2 (agrpo/models/tiny.py), warm-started in code to write a tool call.

A random tiny model never writes `<tool_call>{...}</tool_call>`, so GRPO would have no tool call to reinforce. About
a minute (2 cores) of supervised steps on synthetic transcripts of the secret-word task (agrpo/agents/secret_word.py) teach the
format: transcripts rendered exactly as TRL's rollout worker renders an episode (the model's chat template, the
environment's tool schema), where the model calls `get_secret` in only `call_share` of them and otherwise guesses a
word, and after a tool answer repeats the word it was given. So the policy starts by rarely calling the tool and
earns the reward only when it does: learning to call it is left to GRPO. Nothing is downloaded; the folder is built
once per spec and reused (agrpo/models/folder.py).

The tiny tokenizer is byte-level, which would make the chat template's fixed tool instructions (the system block
that lists the tools) 650 tokens of every prompt. It gets that block as one added token instead, as a real
tokenizer's merges would shorten it: prompts of about 65 tokens keep training, and the warm start, fast on a CPU.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

from agrpo.models.folder import folder_matches, save_model_folder

MARKER = "agrpo_tool_warmstart.json"  # written last: a folder without it is an interrupted build
ENVIRONMENT = "agrpo.agents.secret_word.SecretWordEnv"
IGNORE = -100  # label of context tokens: not trained
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")  # single tokens in Qwen2.5's vocab
CALL_PIECES = ('{"name": "', '", "arguments": ', "get_secret")  # what BPE merges would make of a call's JSON


def episode_tools() -> list[Any]:
    """The tools as the rollout worker passes them to the chat template: the environment's guarded methods."""
    from agrpo.agents.environments import EnvironmentFactory

    return [EnvironmentFactory(ENVIRONMENT)().get_secret]


def system_block(tokenizer: Any, tools: list[Any]) -> str:
    """The text the chat template puts in the system turn when these tools are offered (fixed for a tool set)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "-"}], tools=tools, tokenize=False)
    opening = "<|im_start|>system\n"
    start = text.index(opening) + len(opening)
    return text[start : text.index("<|im_end|>", start)]


class Renderer:
    """Renders episodes as TRL's rollout worker does (the tools in the system turn). What follows the user's prompt
    (the call, the tool's answer) renders the same after every prompt, so it is rendered once per word."""

    def __init__(self, tokenizer: Any, tools: list[Any]):
        self.tokenizer, self.tools = tokenizer, tools
        self._after_prompt: dict[str, tuple[list[int], list[int]]] = {}

    def render(self, turns: list[dict[str, Any]], generation: bool) -> list[int]:
        return self.tokenizer.apply_chat_template(
            turns, tools=self.tools, add_generation_prompt=generation, return_dict=False
        )

    def after_prompt(self, word: str) -> tuple[list[int], list[int]]:
        """(the call the model writes, up to its end-of-turn token; the tool's answer `word` up to the next
        assistant header)."""
        if word not in self._after_prompt:
            asked = [{"role": "user", "content": "-"}]
            called = {"role": "assistant", "content": "", "tool_calls": [call_of("get_secret")]}
            prompt = self.render(asked, True)
            written = self.render([*asked, called], False)[len(prompt) :]
            turn = written[: written.index(self.tokenizer.eos_token_id) + 1]
            answered = self.render([*asked, called, {"role": "tool", "name": "get_secret", "content": word}], True)
            if answered[: len(prompt) + len(turn)] != prompt + turn:
                raise ValueError("the chat template does not keep earlier turns as they were: TRL cannot train on it")
            self._after_prompt[word] = (turn, answered[len(prompt) + len(turn) :])
        return self._after_prompt[word]


def transcript(renderer: Renderer, prompt: str, word: str, call: bool, train_call: bool = True):
    """(token ids, labels, where the tool's answer starts) of one episode: the prompt, then either a get_secret
    call, the tool's answer `word` and `word` as the answer, or `word` guessed at once. Only the assistant's tokens
    are trained, and the call's first token (the choice to call) only with `train_call`: every calling episode
    teaches how to write a call and what to answer after it, without making the call itself more likely."""
    ids = renderer.render([{"role": "user", "content": prompt}], True)
    labels = [IGNORE] * len(ids)
    tool_start = len(ids)
    if call:
        turn, answer_turn = renderer.after_prompt(word)
        decision = turn[:1] if train_call else [IGNORE]  # the first token decides to call: trained in call_share
        labels += decision + turn[1:] + [IGNORE] * len(answer_turn)
        ids = ids + turn + answer_turn
        tool_start += len(turn)
    answer = renderer.tokenizer.encode(word, add_special_tokens=False) + [renderer.tokenizer.eos_token_id]
    return ids + answer, labels + answer, tool_start


def call_of(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": {}}}


def episodes(count: int, call_share: float, seed: int) -> list[tuple[str, str, bool, bool]]:
    """(prompt, word, call, train_call) of `count` synthetic episodes: half answer after a tool call (teaching the
    answer), half guess; the call itself is trained in as many as make `call_share` of the trained first turns."""
    from agrpo.agents.secret_word import WORDS, secret_word_prompts

    rng = random.Random(seed)
    trained_calls = call_share / (1 - call_share)  # of the calling half, against the guessing half
    return [
        (prompt, rng.choice(WORDS), index % 2 == 0, rng.random() < trained_calls)
        for index, prompt in enumerate(secret_word_prompts(count, seed))
    ]


def answer_snippets(rows: list[tuple[list[int], list[int], int]], rng: random.Random, copies: int):
    """Short rows that teach the answer alone: the tool's answer and the reply to it, after a few random byte tokens.
    Repeating a word from 8 tokens back is learnt in tens of steps on such rows, and only after hundreds inside a
    whole episode (a long, nearly constant context hides the one token that matters)."""
    snippets = []
    for ids, labels, tool_start in [row for row in rows if row[2] < len(row[0]) - 2] * copies:  # calling episodes
        prefix = [rng.randrange(256) for _ in range(rng.randrange(4, 24))]
        snippets.append((prefix + ids[tool_start:], [IGNORE] * len(prefix) + labels[tool_start:], len(prefix)))
    return snippets


def padded(rows: list[tuple[list[int], list[int], int]], pad: int):
    """(input ids, attention mask, labels) tensors of `rows`, padded on the right."""
    import torch

    width = max(len(ids) for ids, _, _ in rows)
    return (
        torch.tensor([ids + [pad] * (width - len(ids)) for ids, _, _ in rows]),
        torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in rows]),
        torch.tensor([labels + [IGNORE] * (width - len(labels)) for _, labels, _ in rows]),
    )


def batches(tokenizer: Any, count: int, batch_size: int, call_share: float, seed: int):
    """The training batches as (input ids, attention mask, labels) tensors: first `count` batches of short rows that
    teach the answer alone (cheap: about 30 tokens each), then `count` batches of `batch_size` whole episodes, each
    followed by short rows made from its calling episodes."""
    rng = random.Random(seed)
    renderer = Renderer(tokenizer, episode_tools())
    rows = [transcript(renderer, *episode) for episode in episodes(count * batch_size, call_share, seed)]
    calling = [row for row in rows if row[2] < len(row[0]) - 2]
    for start in range(0, count * batch_size, batch_size):
        yield padded(answer_snippets(rng.sample(calling, batch_size), rng, copies=4), tokenizer.pad_token_id)
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        yield padded(batch, tokenizer.pad_token_id)
        yield padded(answer_snippets(batch, rng, copies=2), tokenizer.pad_token_id)


def base_model(seed: int) -> tuple[Any, Any]:
    """(model, tokenizer): the tiny model, its tokenizer given single tokens for the tool instructions, the tool
    tags and the task's words (as a real tokenizer's merges would have them), and room for them in the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agrpo.agents.secret_word import WORDS
    from agrpo.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="agrpo-tiny-") as base:
        build_tiny_model(base, seed=seed)
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer.add_tokens([system_block(tokenizer, episode_tools()), *TOOL_TAGS, *CALL_PIECES, *WORDS])
    torch.manual_seed(seed)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    return model, tokenizer


def supervised_steps(model: Any, batches: Any, lr: float, total_batches: int) -> None:
    """AdamW over `batches` of (input_ids, attention_mask, labels), in place, the learning rate falling linearly to
    5% over `total_batches`, on one thread (a CPU shared with running servers slows many threads down). The general
    warm start (agrpo/agents/warmstart.py) runs the same loop."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: max(0.05, 1 - done / total_batches))
    model.train()
    try:
        for input_ids, attention_mask, labels in batches:
            model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.eval()


def warm_start(model: Any, tokenizer: Any, steps: int, batch_size: int, call_share: float, lr: float, seed: int):
    """The supervised steps, in place; batches() yields 3 per step."""
    supervised_steps(model, batches(tokenizer, steps, batch_size, call_share, seed), lr, 3 * steps)


def build_secret_word_model(
    output_dir: str | os.PathLike,
    *,
    call_share: float = 0.15,
    steps: int = 120,
    batch_size: int = 8,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> Path:
    """Write the warm-started model + tokenizer to `output_dir` (reused when already built with this spec)."""
    output_dir = Path(output_dir).expanduser().resolve()
    spec = dict(
        base="tiny", call_share=call_share, steps=steps, batch_size=batch_size, learning_rate=learning_rate, seed=seed
    )
    if folder_matches(output_dir, MARKER, spec):
        return output_dir
    model, tokenizer = base_model(seed)
    warm_start(model, tokenizer, steps, batch_size, call_share, learning_rate, seed)
    return save_model_folder(model, tokenizer, output_dir, MARKER, spec)


def main() -> None:
    """`python -m agrpo.agents.tool_warmstart DIR`: build the agent_smoke model once (e.g. before serving it)."""
    import sys

    print(build_secret_word_model(sys.argv[1] if len(sys.argv) > 1 else "outputs/tiny-qwen2-secret-word"))


if __name__ == "__main__":
    main()
