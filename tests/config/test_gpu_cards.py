"""Recipe cards from the estimator (issue 45): each GPU recipe's `# Hardware` lines are what agrpo's GPU planner
computes (agrpo/config/gpu_cards.py) from the model's published config.json values (written here, nothing is
downloaded), so the card cannot claim a GPU the validation pass would refuse."""

from __future__ import annotations

from pathlib import Path

from agrpo.config.compose import compose_run_config
from agrpo.config.gpu_advice import Machine, problems_of
from agrpo.config.gpu_cards import CARDS, card_lines, smallest_card
from tests.config.test_gpu_plan_topologies import QWEN2_5_0_5B

REPO = Path(__file__).resolve().parents[2]
GPU_RECIPES = {"gsm8k": QWEN2_5_0_5B}


def hardware_lines(recipe: str) -> list[str]:
    lines = (REPO / "recipes" / f"{recipe}.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Hardware"))
    return [line.removeprefix("#   ") for line in lines[start + 1 :] if line.startswith("#   ")]


def test_each_gpu_recipes_hardware_lines_are_the_planners():
    for recipe, model_config in GPU_RECIPES.items():
        cfg = compose_run_config([f"+recipe={recipe}"], output_dir="/r")
        assert hardware_lines(recipe) == card_lines(cfg, model_config), recipe


def test_the_smallest_card_is_the_first_the_planner_accepts_and_the_one_below_is_refused():
    cfg = compose_run_config(["+recipe=gsm8k"], output_dir="/r")
    names = [name for name, _ in CARDS]
    for count in (1, 2):
        card = smallest_card(cfg, QWEN2_5_0_5B, count)
        memory = dict(CARDS)[card]
        assert not problems_of(cfg, Machine(count, memory, card), QWEN2_5_0_5B)
        below = names.index(card) - 1
        if below >= 0:
            assert problems_of(cfg, Machine(count, CARDS[below][1], CARDS[below][0]), QWEN2_5_0_5B)
    assert smallest_card(cfg, QWEN2_5_0_5B, 1) == "80 GB"  # not 48 GB, as the card said before issue 45


def test_the_estimate_prints_the_lines_for_a_recipe(tmp_path, capsys):
    import json

    from agrpo.config.gpu_cards import main

    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    main(["+recipe=gsm8k", f"model.name_or_path={tmp_path}"])
    assert capsys.readouterr().out.splitlines() == hardware_lines("gsm8k")
