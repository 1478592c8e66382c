"""trainer/ is laid out as its architecture (issue 44): each folder's `__init__` docstring says what each of its
modules owns. A module added, renamed or deleted without that docstring following fails here, so the map a reader
starts from stays true (a deleted console/child_logging.py was still listed once)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "agrpo" / "trainer"
FOLDERS = sorted(p.parent.name for p in TRAINER.glob("*/__init__.py"))


def test_the_trainer_has_its_four_rooms():
    assert FOLDERS == ["console", "rollout", "seam", "sync"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folders_docstring_names_its_modules_and_no_other(folder):
    here = TRAINER / folder
    doc = ast.get_docstring(ast.parse((here / "__init__.py").read_text())) or ""
    named = set(re.findall(r"(?<![\w/])([a-z_]+)\.py\b", doc))  # a bare name; rollout/guard.py is another folder's
    modules = {p.stem for p in here.glob("*.py")} - {"__init__"}
    assert modules - named == set(), f"agrpo/trainer/{folder}/__init__.py does not say what these own"
    assert named - modules == set(), f"agrpo/trainer/{folder}/__init__.py names modules it does not have"
