"""The pure half of evaluation: pass@k, one problem's record, the summary over problems, the printed table.

No I/O here: the runner (agrpo/eval/runner.py) samples completions and calls these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021): 1 - C(n-c, k) / C(n, k).

    The chance that at least one of k samples drawn without replacement from the n is correct. With k == n it is
    1 when any sample is correct; with k == 1 it is c / n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # Product form: stable for large n, no huge binomials.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class ProblemResult:
    """One problem's k samples, scored: what the per-problem JSONL holds (one line per problem)."""

    index: int
    problem: str
    answer: str
    completions: list[str]
    # Total (weighted) reward per sample, and each term's unweighted score per sample (None: unscorable gold).
    rewards: list[float | None]
    term_scores: dict[str, list[float | None]]
    correct: list[bool]
    truncated: list[bool]
    completion_tokens: list[int]

    @property
    def n(self) -> int:
        return len(self.completions)

    @property
    def num_correct(self) -> int:
        return sum(self.correct)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["num_correct"] = self.num_correct
        record["mean_correct"] = self.num_correct / self.n if self.n else 0.0
        return record


def term_names(names: Sequence[str]) -> list[str]:
    """Unique display names for reward terms (two terms may wrap the same function): `name`, `name#2`, ..."""
    from agrpo.rewards.registry import unique_names

    return unique_names(names, "#")


def total_rewards(weighted: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Per-sample sum of the weighted terms, as TRL sums them; None only when every term is None."""
    totals: list[float | None] = []
    for scores in zip(*weighted, strict=True):
        present = [s for s in scores if s is not None]
        totals.append(sum(present) if present else None)
    return totals


def is_correct(score: float | None, threshold: float) -> bool:
    return score is not None and score >= threshold - 1e-9


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(results: Sequence[ProblemResult], k: int) -> dict[str, Any]:
    """mean@k, pass@1 (unbiased, = mean@k when every problem has k samples), pass@k and reward means over problems.

    mean@k: the share of correct samples per problem, averaged over problems. pass@k: the share of problems with at
    least one correct sample among k (unbiased estimator when a problem has more than k samples).
    """
    if not results:
        raise ValueError("no problems were evaluated")
    per_problem = [r.num_correct / r.n for r in results]
    rewards = [x for r in results for x in r.rewards if x is not None]
    terms: dict[str, list[float]] = {}
    for r in results:
        for name, scores in r.term_scores.items():
            terms.setdefault(name, []).extend(s for s in scores if s is not None)
    samples = [t for r in results for t in r.completion_tokens]
    return {
        "problems": len(results),
        "k": k,
        "samples": sum(r.n for r in results),
        "mean_at_k": _mean(per_problem),
        "pass_at_1": _mean([pass_at_k(r.n, r.num_correct, 1) for r in results]),
        "pass_at_k": _mean([pass_at_k(r.n, r.num_correct, min(k, r.n)) for r in results]),
        "problems_solved": sum(1 for r in results if r.num_correct > 0),
        "mean_reward": _mean(rewards),
        "term_means": {name: _mean(values) for name, values in terms.items()},
        "truncated_fraction": _mean([float(t) for r in results for t in r.truncated]),
        "mean_completion_tokens": _mean([float(t) for t in samples]),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


TABLE_COLUMNS = [
    ("problems", "problems"),
    ("k", "k"),
    ("mean@k", "mean_at_k"),
    ("pass@1", "pass_at_1"),
    ("pass@k", "pass_at_k"),
    ("solved", "problems_solved"),
    ("mean reward", "mean_reward"),
    ("truncated", "truncated_fraction"),
    ("tokens/sample", "mean_completion_tokens"),
]


def markdown_table(summaries: Sequence[dict[str, Any]], labels: Sequence[str] | None = None) -> str:
    """Summaries as Markdown table rows, one per evaluation (a first `model` column when labels are given)."""
    ks = {summary.get("k") for summary in summaries}
    names = [f"pass@{ks.pop()}" if key == "pass_at_k" and len(ks) == 1 else name for name, key in TABLE_COLUMNS]
    lead = ["model"] if labels is not None else []
    header = "| " + " | ".join(lead + names) + " |"
    rule = "|" + "|".join("---" for _ in lead + names) + "|"
    rows = []
    for index, summary in enumerate(summaries):
        cells = ([labels[index]] if labels is not None else []) + [_fmt(summary.get(key)) for _, key in TABLE_COLUMNS]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows])


def render_table(summary: dict[str, Any], title: str) -> str:
    """The summary as a Markdown table (pastes into a recipe card as is)."""
    terms = ", ".join(f"{name} {_fmt(mean)}" for name, mean in summary.get("term_means", {}).items())
    return "\n".join([title, "", markdown_table([summary]), "", f"reward terms (unweighted means): {terms}"])


def problem_of(row: dict[str, Any]) -> str:
    """What the per-problem record shows as the problem: the `problem` column, else the prompt's last user turn."""
    if "problem" in row:
        return str(row["problem"])
    users = [m.get("content", "") for m in row["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""
