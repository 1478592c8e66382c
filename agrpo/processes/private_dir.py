"""A per-user runtime directory for the files a run shares between its own processes (port locks, go files, sockets,
a shared fleet's registry): created with mode 0700, and only ever used once its owner and mode are checked on an
open descriptor, so another user of the machine can neither read it nor make a run create, truncate or write a file
anywhere through it.

Like tmux's /tmp/tmux-<uid> and systemd's $XDG_RUNTIME_DIR (docs/security.md, "Runtime files and port locks"):
- the base is $AGRPO_RUNTIME_DIR, else /tmp/agrpo-<uid>: one place per user whatever the session ($XDG_RUNTIME_DIR
  is set in a login session and not under cron, sudo or many CI runners, and two runs of one user must find the same
  port locks);
- a directory's last component is opened with O_NOFOLLOW | O_DIRECTORY (a planted symlink is refused, not followed),
  then fstat'ed: it must be a directory owned by this process's effective uid with no group or other permission bits.
  Files are then created relative to that descriptor (`dir_fd`), so no component can be swapped between the check and
  the use;
- what is wrong is refused with one paragraph (a LaunchError), never repaired in place: a directory someone else could
  write to may already hold what they planted.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from agrpo.errors import LaunchError

RUNTIME_ENV = "AGRPO_RUNTIME_DIR"
MODE = 0o700
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def runtime_base(environ: dict[str, str] | None = None) -> Path:
    """Where this user's runtime directory is (nothing created): see the module docstring."""
    environ = os.environ if environ is None else environ
    if environ.get(RUNTIME_ENV):
        return Path(environ[RUNTIME_ENV])
    return Path(f"/tmp/agrpo-{os.geteuid()}")


def dir_problem(shown: str, info: os.stat_result | None, uid: int) -> str | None:
    """Why a directory with `info` (None: a symlink or no directory at the name) is no private directory of `uid`
    (pure). One paragraph: what it is, why it matters, what to do."""
    fix = (
        f"remove it (after looking at what it holds) or set {RUNTIME_ENV} to a directory of your own; agrpo creates "
        "its runtime directories with mode 0700"
    )
    if info is None or not stat.S_ISDIR(info.st_mode):
        return (
            f"{shown} is not a directory (a symlink, or a file, is there): agrpo keeps its port locks and runtime files "
            f"in a private directory and never follows a link there, since another user could point it anywhere; {fix}"
        )
    if info.st_uid != uid:
        return (
            f"{shown} belongs to uid {info.st_uid}, not to you (uid {uid}): whoever made it could read or plant this "
            f"run's lock and runtime files; {fix}"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        return (
            f"{shown} has mode {stat.S_IMODE(info.st_mode):04o}, not 0700: other users could read or plant this run's "
            f"lock and runtime files there; {fix} (or `chmod 700` it if you made it and trust what it holds)"
        )
    return None


def _checked(fd: int, shown: str) -> int:
    """`fd` if it is a private directory of ours; closed and refused otherwise."""
    problem = dir_problem(shown, os.fstat(fd), os.geteuid())
    if problem:
        os.close(fd)
        raise LaunchError(problem)
    return fd


def open_child(parent_fd: int, name: str, shown: str) -> int:
    """A descriptor of the private directory `name` inside the directory `parent_fd`, made (0700) when absent."""
    try:
        os.mkdir(name, MODE, dir_fd=parent_fd)  # mkdir never follows a link at the name: EEXIST instead
    except FileExistsError:
        pass
    except OSError as error:
        raise LaunchError(f"cannot create the private directory {shown}: {error.strerror}; set {RUNTIME_ENV}") from None
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LaunchError(dir_problem(shown, None, os.geteuid())) from None
        raise LaunchError(f"cannot open the private directory {shown}: {error.strerror}; set {RUNTIME_ENV}") from None
    return _checked(fd, shown)


def open_private_dir(path: str | Path) -> int:
    """A descriptor (O_CLOEXEC) of the private directory `path`, made 0700 when absent. Its parents are made as
    needed with the default mode and may be links (they are the user's choice, or /tmp); `path` itself is checked."""
    path = Path(os.path.abspath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise LaunchError(
            f"cannot create {path.parent} for the private directory {path}: {error.strerror}; set {RUNTIME_ENV}"
        ) from None
    try:
        return open_child(parent_fd, path.name, str(path))
    finally:
        os.close(parent_fd)


def open_runtime_dir(*names: str) -> int:
    """A descriptor of <runtime base>/<names...>, each level a checked private directory."""
    base = runtime_base()
    fd = open_private_dir(base)
    shown = base
    for name in names:
        shown = shown / name
        try:
            child = open_child(fd, name, str(shown))
        finally:
            os.close(fd)
        fd = child
    return fd


def runtime_dir(*names: str) -> Path:
    """The path of <runtime base>/<names...>, checked (and made) as `open_runtime_dir` does: for a file a child process
    opens by name (a socket, a go file). Code that creates files itself should use the descriptor instead."""
    os.close(open_runtime_dir(*names))
    return runtime_base().joinpath(*names)


def open_to_others_problem(directory: str | Path) -> str | None:
    """Why a file one of this user's processes waits for (a go file) must not be in `directory` (None: it may): the
    directory is not this user's, or others may create files in it (/tmp, a 1777 or group-writable directory), so
    another user could create the file first. Links in the path are followed: only the directory reached counts."""
    try:
        info = os.stat(directory)
    except OSError as error:
        return f"{directory} cannot be checked ({error.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_uid != os.geteuid():
        return f"{directory} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})"
    if stat.S_IMODE(info.st_mode) & 0o022:
        return f"{directory} has mode {stat.S_IMODE(info.st_mode):04o}: other users can create files in it"
    return None
