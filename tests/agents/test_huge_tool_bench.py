"""benchmarks/agent_huge_tool.py's task, checked without a replica (its run needs one: it is a benchmark, run by hand;
docs/your_agent.md has its figures): the folder holds the own-tool task with the tool swapped, and the tool answers
as units.py does until the benchmark drops HUGE_NOW, then 6 MB once, then as before."""

from __future__ import annotations

import importlib.util
import shutil

import yaml

from benchmarks.agent_huge_tool import HUGE_CHARS, task_folder


def test_the_tool_answers_6_mb_once_when_told_and_the_recipe_runs_it():
    folder = task_folder()
    try:
        recipe = yaml.safe_load((folder / "huge_tool.yaml").read_text())
        assert recipe["agent"]["tools"] == ["huge_units.py:convert"] and recipe["run_name"] == "huge_tool"
        assert (folder / "train.jsonl").is_file() and (folder / "test.jsonl").is_file()
        spec = importlib.util.spec_from_file_location("huge_units", folder / "huge_units.py")
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
        assert tool.convert(3, "florp") == "21"  # units.py's answer
        (folder / "HUGE_NOW").write_text("")
        huge = tool.convert(3, "florp")
        assert huge.startswith("21 ") and len(huge) == 3 + HUGE_CHARS >= 6_000_000
        assert (folder / "HUGE_SENT").is_file() and not (folder / "HUGE_NOW").exists()
        assert tool.convert(3, "florp") == "21"  # once
    finally:
        shutil.rmtree(folder, ignore_errors=True)
