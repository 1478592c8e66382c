"""Reward composition from config (weights, bound kwargs, picklability) and the smoke task's reward."""

import pickle

import pytest
from omegaconf import OmegaConf

from agrpo.errors import ConfigError
from agrpo.rewards.base import WeightedReward, completion_text, visible_text
from agrpo.rewards.registry import build_reward_funcs
from agrpo.rewards.smoke import lowercase_fraction


def test_lowercase_fraction_on_strings_and_messages():
    scores = lowercase_fraction(["abcd", "AB cd", "", [{"role": "assistant", "content": "xY"}]])
    assert scores == [1.0, 0.4, 0.0, 0.5]


def test_special_token_markers_earn_no_lowercase_reward():
    # TRL keeps <|im_start|> in completion text; vLLM does not serve it. Emitting it must not pay.
    assert lowercase_fraction(["<|im_start|>XY<|endoftext|>", "<|im_start|>", "ab<|im_start|>CD"]) == [0.0, 0.0, 0.5]
    assert visible_text({"role": "assistant", "content": "x<|eot_id|>y"}) == "xy"
    assert visible_text("a <| not a marker |> b") == "a <| not a marker |> b"


def test_completion_text_reads_assistant_turns_only():
    chat = [
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "IGNORED"},
        {"role": "assistant", "content": "b"},
    ]
    assert completion_text(chat) == "a\n\nb"  # turns apart (issue 32): "3" then "42" is not 342
    with pytest.raises(TypeError):
        completion_text(3)


def test_weights_scale_and_none_stays_none():
    def half_none(completions, **_):
        return [1.0, None]

    reward = WeightedReward(half_none, 0.5)
    assert reward(completions=["a", "b"]) == [0.5, None]
    assert reward.__name__ == "half_none"


def test_build_from_config_binds_kwargs_and_pickles():
    funcs = OmegaConf.create(
        [
            {"_target_": "agrpo.rewards.smoke.lowercase_fraction", "weight": 2.0},
            {"_target_": "agrpo.rewards.smoke.lowercase_fraction", "weight": 1.0, "unused_kwarg": 7},
        ]
    )
    rewards = build_reward_funcs(funcs)
    assert [r.weight for r in rewards] == [2.0, 1.0]
    assert rewards[0](completions=["ab"]) == [2.0]
    assert rewards[1](completions=["aB"]) == [0.5]  # extra kwargs are bound, the function ignores them
    # TRL scores in a spawned process: every reward must survive pickling.
    clones = pickle.loads(pickle.dumps(rewards))
    assert clones[0](completions=["abAB"]) == [1.0]


@pytest.mark.parametrize(
    ("funcs", "message"),
    [
        ([], "reward.funcs is empty"),
        ([{"weight": 1.0}], "_target_"),
        ([{"_target_": "agrpo.rewards.nope.missing"}], "cannot be imported"),
    ],
)
def test_bad_reward_config(funcs, message):
    with pytest.raises(ConfigError, match=message):
        build_reward_funcs(OmegaConf.create(funcs))


def test_terms_get_distinct_names_for_trls_per_term_metrics():
    funcs = OmegaConf.create(
        [
            {"_target_": "agrpo.rewards.smoke.lowercase_fraction"},
            {"_target_": "agrpo.rewards.smoke.lowercase_fraction", "weight": 0.5},
            {
                "_target_": "agrpo.rewards.math.zero_if_truncated",
                "reward": "agrpo.rewards.math.gsm8k_accuracy",
                "max_completion_length": 8,
            },
            {"_target_": "agrpo.rewards.smoke.lowercase_fraction", "name": "letters"},
        ]
    )
    names = [r.__name__ for r in build_reward_funcs(funcs)]
    assert names == ["lowercase_fraction", "lowercase_fraction_2", "zero_if_truncated[gsm8k_accuracy]", "letters"]
