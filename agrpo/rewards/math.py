r"""Math reasoning rewards: GSM8K and MATH accuracy, a format reward, and zero for a completion cut at the length limit.

Every reward follows TRL's signature ``fn(completions, prompts=None, completion_ids=None, **columns)``, reads the gold
answer from the dataset's ``answer`` column, returns unweighted scores (``WeightedReward`` weights them), and returns
None where the gold answer cannot be parsed (TRL leaves such a completion out of the advantage).

Threads: TRL's async rollout worker scores through ``asyncio.to_thread``, and math-verify's timeouts use
``signal.alarm``, which raises outside the main thread. So math-verify runs here with its timeouts off, and the two
ways sympy can stall are refused up front instead: answers longer than ``MAX_ANSWER_CHARS`` score 0, and expressions
whose evaluation would explode (``10^{10^{10}}``, ``100!!``) compare as unequal (:func:`_tame`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from agrpo.rewards.answers import final_answer, gsm8k_gold, last_boxed, last_hash_answer, latex_for_parse, plain_number
from agrpo.rewards.base import completion_text

logger = logging.getLogger(__name__)

# Numbers a comparison may have to evaluate; anything larger marks the expression as one sympy could stall on.
_MAX_MAGNITUDE = 10_000


def _math_verify():
    """math-verify, imported on first use: it pulls in sympy (about a second), which the trainer never needs."""
    import math_verify

    return math_verify


def _tame(expr: Any) -> bool:
    """Whether comparing ``expr`` stays cheap: no power, exp or factorial of a number beyond ``_MAX_MAGNITUDE``.

    Post-order, so a node's numeric arguments have already been found tame before they are evaluated.
    """
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True
    for node in sympy.postorder_traversal(expr):
        if isinstance(node, sympy.Pow):
            arg = node.exp
        elif isinstance(node, (sympy.exp, sympy.factorial, sympy.factorial2, sympy.gamma)):
            arg = node.args[0]
        else:
            continue
        if arg.is_number:
            try:
                size = abs(complex(arg.evalf(15)))
            except (TypeError, ValueError):
                return False
            if not size <= _MAX_MAGNITUDE:
                return False
    return True


@functools.lru_cache(maxsize=8192)
def _parse_latex(answer: str) -> tuple[Any, ...]:
    """math-verify's parse of one answer (cached: every gold answer is scored once per generation of its group)."""
    parsed = _math_verify().parse(latex_for_parse(answer), parsing_timeout=None)
    return tuple(parsed)


def _equivalent(gold: Sequence[Any], predicted: Sequence[Any]) -> bool:
    """math-verify's equivalence, without signal timeouts, after refusing expressions that could stall sympy."""
    if not predicted or not all(_tame(expr) for expr in (*gold, *predicted)):
        return False
    return bool(_math_verify().verify(list(gold), list(predicted), timeout_seconds=None))


def _numbers_equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)


def gsm8k_score(completion: str, gold: str) -> float | None:
    r"""1.0 if the completion's final answer (``#### N``, last ``\boxed{}``, or stated) equals the GSM8K gold number.

    ``gold`` is either the bare number or GSM8K's full solution ending in ``#### N``. Plain numbers (with ``$``,
    thousands separators, ``%``, units, a trailing ``.0``) compare numerically; anything else goes to math-verify.
    """
    if gold is None:
        return None
    gold_text = gsm8k_gold(str(gold))
    gold_number = plain_number(gold_text)
    if gold_number is None:
        gold_parsed = _parse_latex(gold_text)
        if not gold_parsed:
            return None
    answer = final_answer(completion)
    if answer is None:
        return 0.0
    number = plain_number(answer)
    if gold_number is not None and number is not None:
        return float(_numbers_equal(gold_number, number))
    gold_parsed = _parse_latex(gold_text)
    return float(_equivalent(gold_parsed, _parse_latex(answer)))


def math_score(completion: str, gold: str) -> float | None:
    r"""1.0 if the completion's final answer (last ``\boxed{}``, else ``####`` or stated) is math-equivalent to gold.

    ``gold`` is a MATH-style LaTeX answer without delimiters ("\frac{1}{2}", "(1, 8)", "\text{May}").
    """
    gold_parsed = _parse_latex(str(gold)) if gold is not None else ()
    if not gold_parsed:
        return None
    answer = final_answer(completion)
    if answer is None:
        return 0.0
    return float(_equivalent(gold_parsed, _parse_latex(answer)))


def _golds(answer: Any, n: int) -> list[Any]:
    if answer is None:
        raise ValueError("math rewards need the dataset's gold answers in an 'answer' column")
    if isinstance(answer, str):  # one gold for the whole batch, as a hand-written call would pass it
        return [answer] * n
    if len(answer) != n:
        raise ValueError(f"got {len(answer)} gold answers for {n} completions")
    return list(answer)


def gsm8k_accuracy(completions: list[Any], answer: Any = None, **kwargs: Any) -> list[float | None]:
    """GSM8K accuracy: 1.0 per completion whose final answer equals the gold number, 0.0 otherwise."""
    golds = _golds(answer, len(completions))
    return [gsm8k_score(completion_text(c), g) for c, g in zip(completions, golds, strict=True)]


def math_accuracy(completions: list[Any], answer: Any = None, **kwargs: Any) -> list[float | None]:
    r"""MATH accuracy: 1.0 per completion whose final answer (the last ``\boxed{}``, else a ``#### X`` line or "the
    answer is X") math-verify finds equal to the gold answer."""
    golds = _golds(answer, len(completions))
    return [math_score(completion_text(c), g) for c, g in zip(completions, golds, strict=True)]


def boxed_format(completions: list[Any], **kwargs: Any) -> list[float | None]:
    r"""1.0 per completion that ends its reasoning with a non-empty ``\boxed{}`` or ``#### N`` answer, else 0.0.

    Rewards the form the accuracy rewards and the evaluation read, so a model learns to commit to one final answer.
    """
    scores: list[float | None] = []
    for completion in completions:
        text = completion_text(completion)
        marked = [hit for hit in (last_boxed(text), last_hash_answer(text)) if hit is not None and hit[0]]
        scores.append(1.0 if marked else 0.0)
    return scores


def _resolve(func: Callable[..., Any] | str) -> Callable[..., Any]:
    """A callable, or a dotted path to one (so a Hydra config can name the wrapped reward as a plain string)."""
    if callable(func):
        return func
    module, _, name = str(func).rpartition(".")
    return getattr(importlib.import_module(module), name)


class TruncationAware:
    """Wraps a reward so a completion cut at the length limit scores 0.0, as the reference recipe does.

    A completion counts as cut when it holds ``max_completion_length`` tokens or more and, if ``eos_token_ids`` are
    given, its last token is none of them (TRL's own ``completions/clipped_ratio`` test). Without EOS ids, a completion
    that stopped on EOS at exactly the limit also counts as cut: rare, and the safe side. Without ``completion_ids``
    (a hand-written call) nothing counts as cut. None (unparseable gold) stays None.
    """

    def __init__(
        self,
        func: Callable[..., list[float | None]] | str,
        max_completion_length: int,
        eos_token_ids: Sequence[int] | None = None,
    ):
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be positive, got {max_completion_length}")
        self.func = _resolve(func)
        self.max_completion_length = int(max_completion_length)
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else None
        self.__name__ = getattr(self.func, "__name__", type(self.func).__name__)

    def truncated(self, ids: Sequence[int] | None) -> bool:
        """Whether one completion's token ids show it was cut at the length limit."""
        if ids is None or len(ids) < self.max_completion_length:
            return False
        return self.eos_token_ids is None or ids[-1] not in self.eos_token_ids

    def __call__(self, completions: list[Any], completion_ids: list[Any] | None = None, **kwargs: Any):
        scores = self.func(completions=completions, completion_ids=completion_ids, **kwargs)
        if completion_ids is None:
            return scores
        return [
            None if score is None else (0.0 if self.truncated(ids) else score)
            for score, ids in zip(scores, completion_ids, strict=True)
        ]

    def __repr__(self) -> str:
        return f"TruncationAware({self.__name__}, max_completion_length={self.max_completion_length})"


def zero_if_truncated(
    completions: list[Any],
    completion_ids: list[Any] | None = None,
    *,
    reward: Callable[..., list[float | None]] | str,
    max_completion_length: int,
    eos_token_ids: Sequence[int] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """:class:`TruncationAware` as a function, for configs that bind keyword arguments to a reward function.

    ``{_target_: agrpo.rewards.math.zero_if_truncated, reward: agrpo.rewards.math.math_accuracy,
    max_completion_length: ${trainer.max_completion_length}}``
    """
    wrapped = TruncationAware(reward, max_completion_length, eos_token_ids)
    return wrapped(completions=completions, completion_ids=completion_ids, **kwargs)
