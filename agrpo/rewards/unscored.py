"""Completions no reward scored: counted, reported, and the end of a run that scores nothing.

A reward may return None for a completion it cannot judge (TRL's contract: an unparseable gold answer, a row of
another task). A completion for which EVERY term returned None is left out: TRL gives it advantage 0, so it carries
no training signal. Now and then that is expected; group after group it means the rewards never apply (a reward that
returns None by mistake, a column it cannot read), and the run would train every step on nothing. Before this, such
a run logged `reward` as None at every step and crashed in its own end summary.

The policy (pure, fed by the rollout child: agrpo/trainer/rollout/scorer.py):
- every left-out completion is counted (`rollout/unscored_total`, summed in metrics.json as `unscored_completions`);
- the first group whose completions were all left out is one warning line;
- UNSCORED_GROUPS_LIMIT such groups IN A ROW end the run with a RewardError naming the terms and the count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agrpo.rewards.contract import RewardError

# Consecutive groups whose every completion went unscored before the run ends: a few steps' worth at the recipes'
# sizes (8-16 completions a step, 4-8 per group), far more than a dataset mixing tasks puts in a row by chance.
UNSCORED_GROUPS_LIMIT = 8
UNSCORED_METRIC = "rollout/unscored_total"


def is_unscored(reward: float | None) -> bool:
    return reward is None or (isinstance(reward, float) and math.isnan(reward))


@dataclass
class UnscoredTally:
    """Feed it each scored group's summed rewards (NaN or None: every term returned None for that completion)."""

    term_names: Sequence[str] = ()
    limit: int = UNSCORED_GROUPS_LIMIT
    in_a_row: int = 0
    unscored: int = 0
    completions: int = 0
    warned: bool = False

    def add(self, rewards: Sequence[float | None], row: str) -> str | None:
        """Count one group; return a warning line the first time a whole group is left out, else None. Raises a
        RewardError once `limit` groups in a row were left out entirely."""
        left_out = sum(map(is_unscored, rewards))
        self.unscored += left_out
        self.completions += len(rewards)
        whole = bool(rewards) and left_out == len(rewards)
        self.in_a_row = self.in_a_row + 1 if whole else 0
        if self.in_a_row >= self.limit:
            raise RewardError(self.ending(row))
        if whole and not self.warned:
            self.warned = True
            return (
                f"every reward term returned None for all {len(rewards)} completions of the row [{row}]: they are "
                f"left out of training (advantage 0). The run ends if {self.limit} groups in a row are left out"
            )
        return None

    def ending(self, row: str) -> str:
        terms = ", ".join(repr(name) for name in self.term_names) or "the rewards"
        return (
            f"every reward term ({terms}) returned None for all completions of {self.in_a_row} groups in a row "
            f"({self.unscored} of the {self.completions} completions scored so far), the last one the row [{row}]: "
            "there is nothing to train on. None means 'leave this completion out'; a reward that cannot read its "
            "column or parse its answer returns it for everything. Score the completions (0.0 for a wrong answer)"
        )
