"""`agrpo eval`'s agent episodes (agrpo/eval/episodes.py) played against scripted completions: the turns a policy
that calls the tool, one that asks for the wrong player, one that guesses, one that never stops calling and one that
names a missing tool produce, and how they are scored. The same code against a real vLLM server runs in tests/e2e/test_agent.py."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from agrpo.agents.build import Agent
from agrpo.eval.episodes import TURN_SEED_STRIDE, AgentEpisodes, episode_summary
from agrpo.agents.secret_word import PLAYERS, UNKNOWN, SecretWordEnv, load_secret_word_dataset
from agrpo.config.compose import compose_run_config
from agrpo.eval.scoring import term_names
from agrpo.models.tiny import build_tokenizer
from agrpo.rewards.registry import build_reward_funcs

CALL = '<tool_call>\n{"name": "%s", "arguments": {"player": "%s"}}\n</tool_call><|im_end|>'


class Scripted:
    """Answers each turn from a script: `call NAME` (for the player the prompt names), `call NAME PLAYER`, `copy`
    (the word of the last tool answer) or a fixed reply."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.seen = tokenizer, list(script), []

    def __call__(self, prompt_ids, seed):
        self.seen.append((prompt_ids, seed))
        step = self.script[min(len(self.seen), len(self.script)) - 1]
        prompt = self.tokenizer.decode(prompt_ids)
        if step.startswith("call "):
            name, *player = step.split()[1:]
            text = CALL % (name, player[0] if player else re.findall(r"\b(%s)\b" % "|".join(PLAYERS), prompt)[0])
        elif step == "copy":
            text = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt)[-1] + "<|im_end|>"
        else:
            text = step + "<|im_end|>"
        return {"token_ids": self.tokenizer.encode(text, add_special_tokens=False), "finish_reason": "stop"}


@pytest.fixture(scope="module")
def setup():
    cfg = compose_run_config(["+recipe=agent_smoke"], output_dir="/tmp/agrpo-episodes")
    tokenizer = build_tokenizer()
    agent = Agent.from_config(cfg.agent)
    row = load_secret_word_dataset(OmegaConf.create({"max_prompts": 1, "split": "test"}), seed=0)[0]
    return cfg, tokenizer, agent, row


def test_an_episode_that_calls_the_tool_and_repeats_its_word(setup):
    cfg, tokenizer, agent, row = setup
    episodes = AgentEpisodes(agent, tokenizer, params={})
    model = Scripted(tokenizer, ["call get_secret", "copy"])
    episode = episodes.play(model, row, seed=7)
    assert (episode.turns, episode.tool_calls, episode.tool_failures, episode.exhausted) == (2, 1, 0, False)
    assert [m["role"] for m in episode.messages] == ["assistant", "tool", "assistant"]
    assert episode.messages[-1]["content"] == episode.messages[1]["content"]  # the secret, repeated
    assert (episode.environment, episode.environment_reward) == ("SecretWordEnv", 1.0)
    assert [seed for _, seed in model.seen] == [7, 7 + TURN_SEED_STRIDE]
    # the first prompt is rendered as TRL's rollout worker renders it: the chat template with the env's tool, as
    # agrpo hands it to TRL (guarded: its schema without a `return` key, agrpo/agents/tools.py:served_doc)
    from agrpo.agents.environments import guarded_class

    tool = guarded_class(SecretWordEnv, None)().get_secret
    expected = tokenizer.apply_chat_template(row["prompt"], tools=[tool], add_generation_prompt=True, return_dict=False)
    assert model.seen[0][0] == expected


def test_guessing_calling_forever_and_a_missing_tool(setup):
    cfg, tokenizer, agent, row = setup
    episodes = AgentEpisodes(agent, tokenizer, params={})
    guess = episodes.play(Scripted(tokenizer, ["apple"]), row, seed=0)
    assert (guess.turns, guess.tool_calls, guess.environment_reward) == (1, 0, 0.0)
    forever = episodes.play(Scripted(tokenizer, ["call get_secret"]), row, seed=0)
    limit = agent.max_tool_calling_iterations
    assert (forever.turns, forever.tool_calls, forever.exhausted) == (limit + 1, limit, True)
    missing = episodes.play(Scripted(tokenizer, ["call get_password", "done"]), row, seed=0)
    assert (missing.tool_calls, missing.tool_failures) == (1, 1)
    assert "unknown tool get_password" in missing.messages[1]["content"]
    summary = episode_summary([guess, forever, missing])
    assert summary["tool_calls_per_episode"] == pytest.approx((0 + limit + 1) / 3)
    assert summary["tool_loop_exhausted_share"] == pytest.approx(1 / 3)


def test_scoring_uses_every_reward_term_and_the_environments(setup):
    cfg, tokenizer, agent, row = setup
    episodes = AgentEpisodes(agent, tokenizer, params={})
    played = [
        episodes.play(Scripted(tokenizer, ["call get_secret", "copy"]), row, seed=0),
        episodes.play(Scripted(tokenizer, ["call get_secret", "zebra"]), row, seed=1),
        episodes.play(Scripted(tokenizer, ["apple"]), row, seed=2),
        episodes.play(Scripted(tokenizer, ["call get_secret Nobody", "copy"]), row, seed=3),
    ]
    assert played[3].messages[1]["content"] == UNKNOWN and played[3].messages[2]["content"] == UNKNOWN
    rewards = build_reward_funcs(cfg.reward.funcs)
    names = term_names([r.__name__ for r in rewards] + agent.reward_names())
    assert names == ["answer_has_secret", "SecretWordEnv"]
    result = episodes.score(0, row, played, rewards, names, cfg)
    # the wrong player's call reveals nothing: neither the environment nor the answer term pays for it
    assert result.term_scores == {"answer_has_secret": [1.0, 0.0, 0.0, 0.0], "SecretWordEnv": [1.0, 1.0, 0.0, 0.0]}
    assert result.rewards == [2.0, 1.0, 0.0, 0.0]
    assert result.correct == [True, False, False, False]  # eval.correct_term 0: the answer holds the secret
    call = "-> get_secret({'player': '%s'})" % row["player"]
    assert "[tool] " in result.completions[0] and call in result.completions[0], result.completions[0]


def test_a_failing_reward_in_agent_eval_is_the_paragraph_training_gives(setup, tmp_path, monkeypatch):
    """Issue 32: agent eval called each reward directly, so a failing one ended `agrpo eval` with a traceback; it
    is now the RewardError paragraph of training and single-turn eval (agrpo/rewards/contract.py), exit 1."""
    from agrpo.errors import AgrpoError
    from agrpo.rewards.contract import RewardError

    cfg, tokenizer, agent, row = setup
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_reward.py").write_text("def final(completions, **columns):\n    return completions[0][9]\n")
    rewards = build_reward_funcs([{"_target_": "bad_reward.py:final"}])
    episodes = AgentEpisodes(agent, tokenizer, params={})
    played = [episodes.play(Scripted(tokenizer, ["apple"]), row, seed=0)]
    with pytest.raises(RewardError, match=r"reward term 'final' raised IndexError") as raised:
        episodes.score(0, row, played, rewards, ["final", "SecretWordEnv"], cfg)
    assert isinstance(raised.value, AgrpoError) and "bad_reward.py" in str(raised.value)
