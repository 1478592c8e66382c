"""agrpo/trl_compat.py: the list of TRL's private names agrpo relies on is whole, holds in the installed TRL, and a TRL
that lacks or changed one of them stops `python -m agrpo` before anything starts (exit 2, one paragraph, no traceback).

Which private names are TRL's, read from source (ast, nothing imported): a name starting with `_` (not a dunder) that
TRL's own source defines (a def, class, assignment, attribute assignment or import anywhere under the installed `trl`
package), used in agrpo code that works with TRL (every file of agrpo/trainer/, and any other agrpo file that imports
trl) as an attribute (`trainer._lora_dir`, `module._flash_attn = ...`), a method defined in a class (an
override: `async def _score_group`, as the rollout loop had before issue 44), a name imported from trl (`from trl...
import _AsyncRolloutLoop`, as it did too) or a string constant (`require(..., "_flash_attn")`, `getattr(x, "_name")`).
The AST cannot tell which object an attribute is read from, so the rule goes by name: a use is covered when TRL_NAMES
holds a member of that name, and agrpo's own private names that TRL happens to define too are listed in AGRPO_OWN
with where they are agrpo's.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from agrpo import trl_compat
from agrpo.config.compose import compose_overrides
from agrpo.trl_compat import TRL_NAMES, TrlChanged, require, trl_problems, trl_root
from tests.trl_copy import EDITS, copy_trl, edit, run_agrpo

AGRPO = Path(__file__).resolve().parents[2] / "agrpo"

# agrpo's own private names that TRL also defines somewhere: (file under agrpo/, name) -> whose it is.
AGRPO_OWN = {
    ("trainer/sync/background.py", "_run"): "BackgroundSync's own thread body (TRL's `_run` is harbor's)",
}


@cache
def trl_private_definitions() -> frozenset[str]:
    names = set()
    for path in trl_root().rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__") and n != "_")


def imports_trl(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "trl" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trl" and not node.level:
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("trl."):
            return True
    return False


def files_working_with_trl() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(AGRPO.rglob("*.py")):
        rel = path.relative_to(AGRPO).as_posix()
        if rel == "trl_compat.py":  # the list itself
            continue
        tree = ast.parse(path.read_text(), str(path))
        if rel.startswith("trainer/") or imports_trl(tree):
            found.append((rel, tree))
    return found


def names_used(tree: ast.Module) -> list[tuple[str, int]]:
    """(name, line) for every attribute, method defined in a class, name imported from trl, identifier string."""
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            used.append((node.attr, node.lineno))
        elif isinstance(node, ast.ClassDef):
            used += [(d.name, d.lineno) for d in node.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl"):
            used += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            used.append((node.value, node.lineno))
    return used


def listed_names() -> set[str]:
    return {entry.path.rpartition(".")[2] for entry in TRL_NAMES}


def test_every_private_trl_name_agrpo_uses_is_listed():
    trl_names, listed = trl_private_definitions(), listed_names()
    unlisted = [
        f"agrpo/{rel}:{line} uses {name}"
        for rel, tree in files_working_with_trl()
        for name, line in names_used(tree)
        if name in trl_names and name not in listed and (rel, name) not in AGRPO_OWN
    ]
    assert not unlisted, "private TRL names missing from agrpo/trl_compat.py's TRL_NAMES: " + "; ".join(unlisted)


def test_every_listed_name_is_still_used_and_agrpo_own_is_still_needed():
    used = {name for _, tree in files_working_with_trl() for name, _ in names_used(tree)}
    stale = sorted(name for name in listed_names() - {"__init__"} if name not in used)
    assert not stale, f"listed in TRL_NAMES but used nowhere in agrpo: {stale}"
    trl_names = trl_private_definitions()
    assert all(name in trl_names for _, name in AGRPO_OWN), "an AGRPO_OWN name no longer collides with TRL's"


def test_the_rule_finds_a_private_trl_name_in_agrpo_source():
    """The walk can fail: TRL's `_reduce_metric` (async_grpo_trainer) read by agrpo code is caught."""
    tree = ast.parse("from trl.experimental.async_grpo import async_grpo_trainer as m\nm._reduce_metric('k', [])\n")
    assert imports_trl(tree)
    found = [n for n, _ in names_used(tree) if n in trl_private_definitions() and n not in listed_names()]
    assert found == ["_reduce_metric"]


def test_every_listed_name_holds_in_the_installed_trl():
    assert trl_problems() == []
    assert len({entry.dotted for entry in TRL_NAMES}) == len(TRL_NAMES)


def test_the_source_reader_agrees_with_the_imported_modules():
    """What the source reader finds defined, an import finds too (instance attributes aside: only an instance has
    them), so the check reads TRL the way Python does."""
    import importlib

    instance_attributes = 0
    for entry in TRL_NAMES:
        found = trl_compat.locate(trl_root(), entry)
        assert found is not None, entry.dotted
        if found is True:
            instance_attributes += 1
            continue
        owner, _, member = entry.path.rpartition(".")
        obj = importlib.import_module(entry.module)
        assert hasattr(getattr(obj, owner) if owner else obj, member), entry.dotted
    assert 0 < instance_attributes < len(TRL_NAMES)


@pytest.fixture()
def trl_copy(tmp_path) -> Path:
    """A copy of the installed trl package, first on a PYTHONPATH (the tests edit it)."""
    return copy_trl(tmp_path / "site")


@pytest.mark.parametrize("name", sorted(EDITS))
def test_a_changed_trl_is_named_by_the_check(trl_copy, name):
    relative, old, new, expected = EDITS[name]
    edit(trl_copy, relative, old, new)
    problems = trl_problems(trl_copy)
    assert len(problems) == 1 and expected in problems[0], problems


def test_require_refuses_a_name_the_list_does_not_hold():
    with pytest.raises(RuntimeError, match="not in agrpo/trl_compat.py's TRL_NAMES"):
        require("trl.experimental.async_grpo.packing", "register_tree_attention")
    assert require("trl.experimental.async_grpo.packing", "_flash_attn").__name__.endswith("packing")


@pytest.mark.parametrize(
    "name", ["sync_weight_lora", "rollout_hook", "checkpoint_hook", "flash_attn", "parse_response"]
)
def test_a_run_on_a_changed_trl_stops_before_anything_starts(trl_copy, tmp_path, name):
    """`python -m agrpo +recipe=smoke` as a user runs it, with one name of a copy of the installed TRL (first on the
    path) renamed or changed (two private trainer methods, TRL's public hook, a module attribute, the response parser
    agrpo's rollout loop calls):
    exit 2 and one paragraph naming it, no traceback, no replica started, no process of it left (its group)."""
    relative, old, new, expected = EDITS[name]
    edit(trl_copy, relative, old, new)
    run_dir = tmp_path / "run"
    result, left = run_agrpo(["+recipe=smoke", f"hydra.run.dir={run_dir}"], trl_copy, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert expected in result.stderr and f"the installed TRL {trl_compat.trl_version()} ({trl_copy})" in result.stderr
    assert "Traceback" not in output
    assert [line for line in result.stderr.splitlines() if line.strip()] == [result.stderr.strip()]  # one paragraph
    assert not run_dir.exists() or not any(run_dir.rglob("*.log")), sorted(run_dir.rglob("*"))  # nothing started
    assert left == [], f"processes of the run still alive: {left}"


def test_check_trl_raises_one_paragraph_with_exit_code_2(monkeypatch):
    monkeypatch.setattr(trl_compat, "trl_problems", lambda root=None: ["a.b is gone (used by x)", "c.d is gone"])
    with pytest.raises(TrlChanged) as raised:
        trl_compat.check_trl()
    assert raised.value.exit_code == 2
    message = str(raised.value)
    assert "TRL 1.16 (2 names): a.b is gone (used by x); c.d is gone. Nothing was started." in message
    assert "\n" not in message


def test_trl_is_checked_wherever_a_run_launches_from(monkeypatch):
    """A Jobs launch (role=all) checks this machine's TRL too, before any Job is submitted (the trainer Job checks its
    own again); a replica node (check_environment=False) and `agrpo eval` do not: no trainer there."""
    from agrpo.config import prepare as preparing

    checked = []

    def refuse():
        checked.append(True)
        raise TrlChanged("a name is gone")

    monkeypatch.setattr(trl_compat, "check_trl", refuse)
    cfg = compose_overrides(["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket"])
    with pytest.raises(TrlChanged):
        preparing.prepare(cfg)
    preparing.prepare(cfg, check_environment=False)
    assert checked == [True]


def private_entries() -> list:
    """Entries whose path names something private of TRL's (a `_name`, or any member of a private class)."""
    return [e for e in TRL_NAMES if any(part.startswith("_") and part != "__init__" for part in e.path.split("."))]


def test_the_architecture_doc_states_the_lists_counts():
    """docs/architecture.md's counts of TRL_NAMES are today's (issue 44: a doc said "1 left" where none was)."""
    import re

    text = " ".join((AGRPO.parent / "docs" / "architecture.md").read_text().split())
    stated = re.search(r"lists every such name \((\d+) entries.*?; (\d+) of them private", text)
    assert stated, "docs/architecture.md no longer states TRL_NAMES' counts in the form this test reads"
    assert tuple(map(int, stated.groups())) == (len(TRL_NAMES), len(private_entries()))
    assert len(private_entries()) <= 15  # issue 44's target
    assert not [e for e in TRL_NAMES if "_AsyncRolloutLoop" in e.path]  # the loop is agrpo's own


def test_every_private_name_says_why_no_public_hook_serves():
    """Each private entry carries one line of why (issue 44: the list shrinks to what has no public hook)."""
    assert [e.dotted for e in private_entries() if not e.why.strip()] == []
    assert [e.dotted for e in TRL_NAMES if e.why and e not in private_entries()] == []  # public names need none
