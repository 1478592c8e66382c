"""The agent_smoke model's warm start (agrpo/agents/tool_warmstart.py), without training it: the synthetic episodes
are exactly what TRL's rollout worker renders, only the assistant's tokens are trained, the choice to call is
trained in `call_share` of the first turns, and the tokenizer's added tokens shorten prompts without changing them.
The trained model is exercised by tests/e2e/test_agent.py."""

from __future__ import annotations

import pytest

from agrpo.agents.tool_warmstart import IGNORE, Renderer, base_model, episode_tools, episodes, transcript


@pytest.fixture(scope="module")
def tokenizer():
    return base_model(seed=0)[1]


def test_an_episode_is_rendered_as_trl_renders_it(tokenizer):
    tools = episode_tools()
    ids, labels, tool_start = transcript(
        Renderer(tokenizer, tools), "Player 7: What is the secret word?", "tiger", True
    )
    conversation = [
        {"role": "user", "content": "Player 7: What is the secret word?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_secret", "arguments": {}}}]},
        {"role": "tool", "name": "get_secret", "content": "tiger"},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, return_dict=False)
    answer = tokenizer.encode("tiger", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert ids == rendered + answer
    trained = tokenizer.decode([token for token in labels if token != IGNORE])
    assert trained == '<tool_call>\n{"name": "get_secret", "arguments": {}}\n</tool_call><|im_end|>tiger<|im_end|>'
    assert tokenizer.decode(ids[tool_start:]).startswith("\n<|im_start|>user\n<tool_response>\ntiger")


def test_the_choice_to_call_is_trained_only_where_asked(tokenizer):
    renderer = Renderer(tokenizer, episode_tools())
    ids, labels, _ = transcript(renderer, "Player 7: Tell me the secret word.", "apple", True, train_call=False)
    first = next(i for i, token in enumerate(ids) if token == tokenizer.convert_tokens_to_ids("<tool_call>"))
    assert labels[first] == IGNORE and labels[first + 1] == ids[first + 1]  # the rest of the call is still taught
    guessed, guess_labels, _ = transcript(renderer, "Player 7: Tell me the secret word.", "lemon", False)
    assert tokenizer.decode([t for t in guess_labels if t != IGNORE]) == "lemon<|im_end|>"
    planned = episodes(4000, call_share=0.25, seed=0)
    trained_calls = sum(call and train for _, _, call, train in planned)
    guesses = sum(not call for _, _, call, _ in planned)
    assert trained_calls / (trained_calls + guesses) == pytest.approx(0.25, abs=0.03)


def test_added_tokens_shorten_the_prompt_and_survive_a_save(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tools = episode_tools()
    prompt = [{"role": "user", "content": "Player 7: What is the secret word?"}]
    ids = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, return_dict=False)
    assert len(ids) < 100  # the byte-level tokenizer alone needs 726 tokens for it
    text = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, return_dict=False) == ids


def test_the_plain_tool_variant_shows_the_model_the_same_tool(tokenizer):
    """agent=secret_word_tool offers get_secret as a function: the prompt is the one the model was warm-started on."""
    from agrpo.agents.tools import GuardedTool

    prompt = [{"role": "user", "content": "Player 7: What is the secret word?"}]
    plain = [GuardedTool("agrpo.agents.secret_word.get_secret").method]
    assert tokenizer.apply_chat_template(prompt, tools=plain, return_dict=False) == tokenizer.apply_chat_template(
        prompt, tools=episode_tools(), return_dict=False
    )
