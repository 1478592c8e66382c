"""The guides read the way their readers copy them: the bash blocks (each line a command, in page order), the recipe
block and the code files, exactly as printed. Each helper reads docs/your_task.md unless given another guide."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "your_task.md"
AGENT_GUIDE = DOCS / "your_agent.md"


def code_blocks(language: str, markdown: str | None = None, guide: Path = GUIDE) -> list[str]:
    """The fenced blocks of one language, in page order, exactly as printed."""
    text = guide.read_text() if markdown is None else markdown
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def recipe() -> str:
    return GUIDE.read_text().split("`my_task.yaml`, next to the data:\n\n```yaml\n", 1)[1].split("\n```", 1)[0] + "\n"


def named_blocks(language: str, guide: Path = GUIDE) -> dict[str, str]:
    """{file name: block} for the blocks whose first line names their file (`# my_tools.py`, `# my_agent.yaml (...)`)."""
    named = {}
    for block in code_blocks(language, guide=guide):
        first = re.match(r"# ([\w.-]+\.\w+)", block)
        if first:
            named[first.group(1)] = block
    return named


def commands(prefix: str, guide: Path = GUIDE) -> list[str]:
    """The one-line commands of the bash blocks that start with `prefix`, in page order (a block holding a heredoc,
    a script rather than commands, is left out)."""
    lines = [line for block in code_blocks("bash", guide=guide) if "<<" not in block for line in block.splitlines()]
    return [line for line in lines if line.startswith(prefix)]


def with_args(command: str, *args: str) -> str:
    """`command` with `args` appended before its trailing comment (arguments the page cannot know: a test's server)."""
    code, hash_, comment = command.partition("  #")
    return " ".join([code.rstrip(), *args]) + (f"  #{comment}" if hash_ else "")
