"""docs/your_task.md's code, executed as printed: the reward example is taken from the page's own code block, built
the way the trainer builds it, and called the way training calls it (the rollout loop: chat messages) and the
way `agrpo eval` calls it; both give the same scores (the one reward contract, agrpo/rewards/contract.py)."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.docs.guide import GUIDE, code_blocks


def the_reward_file() -> str:
    blocks = [b for b in code_blocks("python") if b.startswith("# my_rewards.py\n")]
    assert len(blocks) == 1, "docs/your_task.md shows one my_rewards.py"
    return blocks[0]


def test_the_guides_reward_scores_training_and_eval_calls_alike(tmp_path, monkeypatch):
    from agrpo.eval.runner import score_problem
    from agrpo.rewards.contract import as_messages
    from agrpo.rewards.registry import build_reward_funcs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(the_reward_file())
    [reward] = build_reward_funcs([{"_target_": "my_rewards.py:starts_politely", "weight": 0.2}])
    texts = ["Sure, it is 7.", "7", "  certainly: 7"]
    prompt = [{"role": "user", "content": "What is 3 + 4? Reply with the number only."}]
    training = reward(
        completions=[as_messages(t) for t in texts],  # what the rollout loop passes
        prompts=[prompt] * 3,
        completion_ids=[[1], [2], [3]],
        question=["What is 3 + 4?"] * 3,
        answer=[7] * 3,
    )
    assert training == [0.2, 0.0, 0.2]
    cfg = OmegaConf.create({"eval": {"correct_term": 0, "correct_threshold": 1.0}})
    choices = [{"text": t, "token_ids": [1], "finish_reason": "stop"} for t in texts]
    row = {"prompt": prompt, "question": "What is 3 + 4?", "answer": 7}
    result = score_problem(0, row, choices, [reward], ["starts_politely"], cfg)
    assert result.term_scores == {"starts_politely": [1.0, 0.0, 1.0]} and result.rewards == training


def test_the_guide_shows_the_error_a_string_reward_gives(tmp_path):
    """The paragraph quoted on the page is the one the contract produces for the classic mistake."""
    from agrpo.rewards.contract import RewardError, as_messages
    from agrpo.rewards.registry import build_reward_funcs

    (tmp_path / "my_rewards.py").write_text(
        "def starts_politely(completions, answer, **columns):\n"
        "    return [1.0 if c.strip().lower().startswith(('sure', 'certainly')) else 0.0 for c in completions]\n"
    )
    [reward] = build_reward_funcs([{"_target_": f"{tmp_path}/my_rewards.py:starts_politely"}])
    prompt = [{"role": "user", "content": "What is 18 + 5? Reply with the number only."}]
    try:
        reward(completions=[as_messages("23")], prompts=[prompt], question=["What is 18 + 5?"], answer=[23])
    except RewardError as error:
        shown = " ".join(GUIDE.read_text().split("    agrpo: error: ", 1)[1].split("\n\n", 1)[0].split())
        assert shown.startswith(str(error).split(" A completion reaches")[0])
    else:
        raise AssertionError("a string reward passed")
