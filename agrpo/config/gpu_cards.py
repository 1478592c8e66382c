"""The smallest GPU a recipe fits, computed by agrpo's GPU planner (issue 45: recipe cards from the estimator).

The gsm8k recipe once said "one 48 GB GPU" by hand while agrpo's own estimate refused it. Here the card line is
what the planner (agrpo/config/gpu_plan.py, agrpo/config/gpu_advice.py) accepts on common cards, one GPU shared by the
trainer and the replica, or two (the replica on the second), as shipped and with the knobs that shrink the trainer.
tests/config/test_gpu_cards.py checks each GPU recipe's `# Hardware` line against it.

    python -m agrpo.config.gpu_cards +recipe=gsm8k     # from the model's config.json (fetched where the Hub answers)
"""

from __future__ import annotations

from typing import Any

from agrpo.config.gpu_advice import Machine, problems_of, smaller_budgets, with_overrides

MIB = 1024**2
# Common cards, each GPU's memory as nvidia-smi reports it (what torch's total_memory is).
CARDS = (("24 GB", 23028 * MIB), ("48 GB", 46068 * MIB), ("80 GB", 81559 * MIB), ("141 GB", 143771 * MIB))
CHECKPOINTING = "trainer.gradient_checkpointing=true"


def smallest_card(cfg: Any, model_config: dict[str, Any], count: int) -> str | None:
    """The smallest of CARDS on which `count` GPUs run `cfg` by the planner's estimates (None: none of them)."""
    for name, memory in CARDS:
        if not problems_of(cfg, Machine(count, memory, f"a {name} GPU"), model_config):
            return name
    return None


def variants(cfg: Any) -> list[tuple[str, ...]]:
    """As shipped; with gradient checkpointing; with it and half the token budget."""
    found: list[tuple[str, ...]] = [()]
    if not cfg.trainer.gradient_checkpointing:
        found.append((CHECKPOINTING,))
    halves = smaller_budgets(cfg)
    if halves:
        found.append((*found[-1], f"trainer.token_budget={halves[0]}"))
    return found


def card_lines(cfg: Any, model_config: dict[str, Any]) -> list[str]:
    """One line per variant: the smallest card for one GPU and for two (a recipe's `# Hardware` lines)."""
    lines = []
    for overrides in variants(cfg):
        changed = with_overrides(cfg, overrides)
        one, two = smallest_card(changed, model_config, 1), smallest_card(changed, model_config, 2)
        if one is None and two is None:
            fits = f"none of {CARDS[0][0]} to {CARDS[-1][0]}, one GPU or two"
        else:
            fits = f"one {one} GPU" if one else "no single GPU listed"
            fits += f" or two {two}" if two and two != one else (" (or two)" if two else "")
        lines.append(f"{' '.join(overrides) or 'as shipped'}: {fits}")
    return lines


def main(argv: list[str] | None = None) -> None:
    import sys

    from agrpo.config.compose import compose_overrides, estimate_run_dir
    from agrpo.config.model_config_fetch import model_config_for_check

    cfg = compose_overrides(list(sys.argv[1:] if argv is None else argv), output_dir=estimate_run_dir())
    config, why = model_config_for_check(str(cfg.model.name_or_path))
    if config is None:
        raise SystemExit(f"no estimate: {why}")
    print("\n".join(card_lines(cfg, config)))


if __name__ == "__main__":
    main()
