"""The agent_smoke task (agrpo/agents/secret_word.py): only a call for the row's own player reveals the secret, and
only a revealed word in the final answer earns the answer term."""

from __future__ import annotations

from omegaconf import OmegaConf

from agrpo.agents.secret_word import PLAYERS, UNKNOWN, WORDS, SecretWordEnv, answer_has_secret, load_secret_word_dataset


def test_rows_name_their_player_in_the_prompt():
    rows = load_secret_word_dataset(OmegaConf.create({"max_prompts": 40, "split": "train"}), seed=0)
    assert set(rows["player"]) <= set(PLAYERS) and len(set(rows["player"])) > 4
    for row in rows:
        assert row["player"] in row["prompt"][0]["content"]


def test_only_the_rows_player_reveals_the_secret():
    env = SecretWordEnv()
    env.reset(player="Chen", prompt=[])
    assert env.get_secret("Ada") == UNKNOWN and env.get_reward() == 0.0
    word = env.get_secret("chen ")  # the name as the model may write it
    assert word in WORDS and env.get_reward() == 1.0
    env.reset(player="Ada")
    assert env.get_reward() == 0.0  # a new episode reveals nothing yet


def test_the_answer_term_pays_for_a_revealed_word_only():
    def episode(tool: str, answer: str):
        return [
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": tool},
            {"role": "assistant", "content": answer},
        ]

    scores = answer_has_secret(
        [
            episode("tiger", "tiger"),
            episode("tiger", "apple"),
            episode(UNKNOWN, UNKNOWN),
            [{"role": "assistant", "content": "tiger"}],
        ]
    )
    assert scores == [1.0, 0.0, 0.0, 0.0]
