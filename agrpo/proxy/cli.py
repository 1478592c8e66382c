"""`python -m agrpo.proxy`: one flag per ProxySettings field, errors in one paragraph."""

import argparse
import asyncio
import errno
import logging
import signal
import sys
import typing
from dataclasses import MISSING, fields

from agrpo.proxy.settings import ProxySettings, flag_name

log = logging.getLogger("agrpo.proxy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agrpo.proxy",
        description="Make N vLLM replicas look like one server: prefix- and group-affine "
        "routing of completions, all-or-nothing broadcast of adapter loads, "
        "pause and resume.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    hints = typing.get_type_hints(ProxySettings)
    for f in fields(ProxySettings):
        flag = "--" + flag_name(f.name)
        why = f.metadata.get("help", "")
        kind = hints[f.name]
        if f.name == "upstreams":
            parser.add_argument(
                flag, dest=f.name, action="append", default=[], metavar="URL", help=why + " (repeat the flag)"
            )
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=why)
        elif kind in (int, float, str):
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=why)
        else:  # Optional[str]
            parser.add_argument(flag, dest=f.name, type=str, default=default, help=why)
    return parser


def settings_from_args(argv: list[str] | None = None) -> ProxySettings:
    """Parse the command line into settings (argparse exits 2 on a malformed flag)."""
    return ProxySettings(**vars(build_parser().parse_args(argv)))


def _fail(message: str, code: int) -> int:
    print(f"agrpo.proxy: cannot start: {message}. See `python -m agrpo.proxy --help`.", file=sys.stderr)
    return code


async def serve(settings: ProxySettings) -> None:
    """Run until SIGINT or SIGTERM, then close cleanly (exit 0): requests in flight get --shutdown-timeout-s, the
    rest is cancelled, sessions are closed. The handlers come first, so a signal during start-up (the health probes)
    also ends in a clean stop rather than a KeyboardInterrupt or the signal's default death."""
    from agrpo.proxy.server import ProxyServer

    server = ProxyServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(f"agrpo.proxy listening on {server.url} in front of {len(server.replicas)} replica(s)", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    settings = settings_from_args(argv)
    problems = settings.problems()
    if problems:
        return _fail("; ".join(problems), 2)
    logging.basicConfig(
        level=settings.log_level.upper() if isinstance(settings.log_level, str) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    loop_factory = None
    if settings.use_uvloop:
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(settings))
    except ValueError as err:  # settings the server rejects (e.g. an empty token variable)
        return _fail(str(err), 2)
    except OSError as err:
        if err.errno == errno.EADDRINUSE or "address already in use" in str(err).lower():
            return _fail(
                f"port {settings.port} on {settings.host} is already in use; pick "
                "another with --port (0 picks any free port)",
                1,
            )
        return _fail(f"could not listen on {settings.host}:{settings.port}: {err}", 1)
    except KeyboardInterrupt:
        pass
    return 0
