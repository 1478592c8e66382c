"""docs/your_task.md read the way its reader copies it: the bash blocks (each line a command, in page order), the
recipe block and the reward file, exactly as printed."""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "your_task.md"


def code_blocks(language: str, markdown: str | None = None) -> list[str]:
    """The fenced blocks of one language, in page order, exactly as printed."""
    text = GUIDE.read_text() if markdown is None else markdown
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def recipe() -> str:
    return GUIDE.read_text().split("`my_task.yaml`, next to the data:\n\n```yaml\n", 1)[1].split("\n```", 1)[0] + "\n"


def commands(prefix: str) -> list[str]:
    """The one-line commands of the bash blocks that start with `prefix`, in page order."""
    lines = [line for block in code_blocks("bash")[1:] for line in block.splitlines()]
    return [line for line in lines if line.startswith(prefix)]


def with_args(command: str, *args: str) -> str:
    """`command` with `args` appended before its trailing comment (arguments the page cannot know: a test's server)."""
    code, hash_, comment = command.partition("  #")
    return " ".join([code.rstrip(), *args]) + (f"  #{comment}" if hash_ else "")
