"""The per-user runtime directory (agrpo/processes/private_dir.py) against a second local user (uid 65534, real
processes): what they plant where the directory goes (a link into a root-only directory, a directory of theirs, a
directory of ours left open) is refused with one paragraph, and nothing is created or written through it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agrpo.errors import LaunchError
from agrpo.processes.private_dir import RUNTIME_ENV, dir_problem, open_runtime_dir, runtime_base, runtime_dir
from tests.hostile_user import NEEDS_ROOT, NOBODY, as_nobody, tree


@pytest.fixture
def victim(tmp_path):
    """A directory only root may write to: where a followed link would have made the run create its files."""
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    return victim


def test_the_base_is_one_per_user_whatever_the_session_and_never_the_old_shared_path(tmp_path):
    uid = os.geteuid()
    assert runtime_base({}) == runtime_base({"XDG_RUNTIME_DIR": str(tmp_path)}) == Path(f"/tmp/agrpo-{uid}")
    assert runtime_base({RUNTIME_ENV: "/x/y"}) == Path("/x/y")


def test_it_is_made_0700_and_its_subdirectories_too(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "run" / "agrpo"))
    path = runtime_dir("fleet", "registry")
    assert path == tmp_path / "run" / "agrpo" / "fleet" / "registry" and path.is_dir()
    for level in (path, path.parent, path.parent.parent):
        info = level.lstat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    fd = open_runtime_dir("fleet")  # again: the same directories, accepted
    assert os.get_inheritable(fd) is False
    os.close(fd)


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (None, r"is not a directory \(a symlink, or a file, is there\)"),
        ((stat.S_IFDIR | 0o700, 65534), r"belongs to uid 65534, not to you \(uid 0\)"),
        ((stat.S_IFDIR | 0o1777, 0), r"has mode 1777, not 0700"),
        ((stat.S_IFDIR | 0o750, 0), r"has mode 0750, not 0700"),
        ((stat.S_IFREG | 0o600, 0), r"is not a directory"),
    ],
)
def test_dir_problem_names_what_is_wrong_and_the_way_out(info, expected):
    result = os.stat_result((info[0], 0, 0, 1, info[1], 0, 0, 0, 0, 0)) if info else None
    problem = dir_problem("/tmp/agrpo-0", result, 0)
    assert problem is not None and __import__("re").search(expected, problem), problem
    assert problem.startswith("/tmp/agrpo-0 ") and RUNTIME_ENV in problem and "\n" not in problem
    assert dir_problem("/tmp/agrpo-0", os.stat_result((stat.S_IFDIR | 0o700, 0, 0, 1, 0, 0, 0, 0, 0, 0)), 0) is None


@pytest.mark.requires(NEEDS_ROOT)
def test_a_link_planted_by_another_user_is_refused_and_nothing_is_created_through_it(monkeypatch, shared, victim):
    as_nobody("import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(victim), str(shared / "agrpo-0"))
    monkeypatch.setenv(RUNTIME_ENV, str(shared / "agrpo-0"))
    with pytest.raises(LaunchError, match=r"agrpo-0 is not a directory \(a symlink"):
        runtime_dir("ports")
    assert tree(victim) == []  # no `ports` made in the root-only directory the link points at


@pytest.mark.requires(NEEDS_ROOT)
def test_a_directory_of_another_user_is_refused_and_nothing_is_created_in_it(monkeypatch, shared):
    as_nobody("import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", str(shared / "agrpo-0"))
    monkeypatch.setenv(RUNTIME_ENV, str(shared / "agrpo-0"))
    with pytest.raises(LaunchError, match=rf"agrpo-0 belongs to uid {NOBODY}, not to you"):
        open_runtime_dir("ports")
    assert tree(shared / "agrpo-0") == []


@pytest.mark.requires(NEEDS_ROOT)
def test_a_link_in_a_subdirectory_place_is_refused(monkeypatch, shared, victim, tmp_path):
    """A link where a subdirectory goes (only this user could put it there, but it is refused all the same)."""
    base = tmp_path / "agrpo"
    base.mkdir(mode=0o700)
    (base / "ports").symlink_to(victim)
    monkeypatch.setenv(RUNTIME_ENV, str(base))
    with pytest.raises(LaunchError, match=r"ports is not a directory \(a symlink"):
        open_runtime_dir("ports")
    assert tree(victim) == []


def test_our_own_directory_left_open_to_others_is_refused_not_repaired(monkeypatch, tmp_path):
    base = tmp_path / "agrpo"
    base.mkdir()
    os.chmod(base, 0o755)
    monkeypatch.setenv(RUNTIME_ENV, str(base))
    with pytest.raises(LaunchError, match=r"has mode 0755, not 0700.*chmod 700"):
        open_runtime_dir("ports")
    assert tree(base) == [] and stat.S_IMODE(base.stat().st_mode) == 0o755
