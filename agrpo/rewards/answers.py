r"""Finding and cleaning the final answer in a completion: pure string functions, no math-verify.

math-verify only looks for LaTeX anchors (``\boxed{}``, ``$...$``), so answers written GSM8K-style (``#### 72``) or
in prose ("The answer is 72.") are extracted here first and handed to it as a bare expression.
"""

from __future__ import annotations

import re

# The longest answer we hand to sympy: math-verify runs without its signal timeouts (see ``agrpo.rewards.math``), so
# a long answer is a cost we refuse rather than a hang we risk. Real final answers are far shorter.
MAX_ANSWER_CHARS = 300

_BOXED = re.compile(r"\\(?:boxed|fbox)(\s*)")
# "#### 72" at a line start or after a space; the answer must look like one, so a markdown "#### Step 1" is no marker.
_HASH = re.compile(r"(?:^|(?<=\s))#{4}[ \t]*([-+$\\(.\d][^\n]*?)[ \t]*$", re.MULTILINE)
_STATED = re.compile(r"answer\s*(?:is|:)\s*(?::\s*)?", re.IGNORECASE)
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<=\d)(?:,|\{,\}|\\,|\\!|\s)(?=\d{3}(?!\d))")
_NUMBER_WITH_UNITS = re.compile(r"(-?\d+(?:\.\d+)?|-?\.\d+)\s*(?:[a-zA-Z][a-zA-Z.'/ ]*)?")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The contents of the brace group opening at ``text[start]``, and the index after it; None if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> tuple[str, int] | None:
    r"""The contents of the last ``\boxed{...}`` (or ``\fbox{}``, or ``\boxed 5``) and where it starts, else None."""
    for match in reversed(list(_BOXED.finditer(text))):
        end = match.end()
        if text.startswith("{", end):
            group = _braced(text, end)
            if group is not None:
                return group[0].strip(), match.start()
        elif match.group(1):  # "\boxed 5": the one token after the space
            token = re.match(r"[^\s$,]+", text[end:])
            if token:
                return token.group(0).rstrip("."), match.start()
    return None


def last_hash_answer(text: str) -> tuple[str, int] | None:
    """The text after the last ``#### `` marker line (GSM8K's own format) and where it starts, else None."""
    matches = [m for m in _HASH.finditer(text) if m.group(1)]
    if not matches:
        return None
    last = matches[-1]
    return last.group(1).strip(), last.start()


def stated_answer(text: str) -> str | None:
    """The answer after the last "answer is" / "Answer:": its first math span, else the rest of that sentence."""
    matches = list(_STATED.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].lstrip(" *")
    span = _MATH_SPAN.match(rest)
    if span:
        return next(group for group in span.groups() if group is not None).strip()
    line = rest.split("\n", 1)[0]
    line = re.split(r"\.(?:\s|$)", line, maxsplit=1)[0]  # up to the end of the sentence, keeping decimals
    return line.strip(" *.") or None


def final_answer(text: str) -> str | None:
    r"""The completion's final answer: the later of its last ``\boxed{}`` and last ``####`` line, else a stated one.

    The later marker wins because models restate: a ``\boxed{}`` inside a discarded attempt precedes the final line.
    """
    found = [hit for hit in (last_boxed(text), last_hash_answer(text)) if hit is not None]
    if found:
        answer = max(found, key=lambda hit: hit[1])[0]
    else:
        answer = stated_answer(text)
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


def gsm8k_gold(answer: str) -> str:
    """The final number of a GSM8K solution (the text after its ``####``), or the text itself if it has none."""
    return answer.rsplit("####", 1)[-1].strip()


def plain_number(answer: str) -> float | None:
    r"""The number in an answer that is a plain number, perhaps with ``$``, thousands separators, ``%`` or units.

    "\$1,080.00", "1{,}080 \text{ dollars}", "25%", "18 cm" give 1080.0, 1080.0, 25.0, 18.0; "\frac{1}{2}", "2+3" and
    "x = 5" give None (math-verify handles those).
    """
    text = _TEXT_CMD.sub(r" \1", answer)
    text = text.replace("\\$", " ").replace("$", " ").replace("\\%", " ").replace("%", " ")
    text = re.sub(r"\\[,;:! ]|\\q?quad", " ", text)
    text = _THOUSANDS.sub("", text.strip())
    text = text.strip().rstrip(".").strip()
    match = _NUMBER_WITH_UNITS.fullmatch(text)
    if match is None:
        return None
    return float(match.group(1))


def latex_for_parse(answer: str) -> str:
    """An extracted answer as math-verify's LaTeX parser wants it: inside ``$...$``, surrounding ``$`` removed."""
    return "$" + answer.strip().strip("$").strip() + "$"
