"""No line in fleet/steps.jsonl and no answer of the proxy can end a run through the fleet controller (issue 42: `[1]`
ended one 6 s later at `entry.get` on a list). Hypothesis feeds poll() garbage lines and garbage /proxy/stats
answers; the last test runs the real controller, with its real HTTP client against a port nothing listens on, on a
real steps.jsonl holding `[1]`, `NaN`, `null` and a truncated line among good ones."""

from __future__ import annotations

import json
import socket
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agrpo.fleet import files
from agrpo.fleet.controller import FleetController
from agrpo.fleet.policy import Knobs
from tests.test_interprocess import bad_lines, good_steps, json_values


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def controller(run_dir: str, clock: Clock, answers: list[bytes] | None = None, **kwargs) -> FleetController:
    def get(url: str) -> bytes:
        return answers.pop(0) if answers else b"garbage"

    extra = {"get": get, "send": lambda *a: b"[]"} if answers is not None else {}
    return FleetController(
        run_dir=run_dir,
        admin_token="admin",
        spares=[],
        supervised=[],
        started=[],
        knobs=Knobs(min_replicas=1, max_replicas=2, window_steps=3, cooldown_s=1, backoff_s=1),
        poll_s=1.0,
        clock=clock,
        healthy=lambda url: False,
        **extra,
        **kwargs,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.booleans(), good_steps, bad_lines), min_size=1, max_size=10),
    st.lists(json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=30), max_size=4),
)
def test_poll_never_raises_counts_bad_lines_and_keeps_good_ones(mixed, answers):
    with tempfile.TemporaryDirectory() as run_dir:
        clock = Clock()
        fleet = controller(run_dir, clock, list(answers), proxy_url="http://proxy", say=lambda line: None)
        path = files.steps_path(run_dir)
        path.write_bytes(b"".join((json.dumps(g).encode() if keep else bad) + b"\n" for keep, g, bad in mixed))
        for t in (5.0, 10.0, 15.0):
            clock.t = t
            fleet.poll()  # reads the lines, asks the (garbage) proxy, decides
        bad = sum(1 for keep, _, _ in mixed if not keep)
        assert fleet.reader.skipped.counts.get("steps.jsonl", 0) == bad
        assert fleet.samples == int(sum(g.get("batch/samples_per_step", 0) for keep, g, _ in mixed if keep))
        assert files.read_state(run_dir)["skipped"] == fleet.skipped.total >= bad
        fleet.finish()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_real_controller_reads_past_garbage_in_a_real_steps_file(tmp_path):
    clock, lines = Clock(), []
    good = [{"perf/step_s": 2.0, "perf/rollout_wait_s": 1.5, "batch/samples_per_step": 8.0}] * 4
    garbage = [b"[1]", b"NaN", b"null", b'{"perf/step_s": 2.0, "perf/rollo']  # the last one cut off mid-line
    text = [json.dumps(good[0]).encode(), *garbage[:2], json.dumps(good[1]).encode(), *garbage[2:], b""]
    fleet = controller(str(tmp_path), clock, proxy_url=f"http://127.0.0.1:{free_port()}", say=lines.append)
    files.steps_path(tmp_path).write_bytes(b"\n".join(text))  # as the trainer appends them
    clock.t = 5.0
    fleet.poll()
    with files.steps_path(tmp_path).open("ab") as out:
        out.write(b"\n".join(json.dumps(g).encode() for g in good[2:]) + b"\n" + b'{"perf/step_s": 2')
    clock.t = 10.0
    fleet.poll()  # the partial last line waits for its end; four good steps in the window
    assert [e["perf/step_s"] for e in fleet.window] == [2.0] * 4 and fleet.samples == 32
    assert fleet.skipped.counts == {"steps.jsonl": 4}
    assert files.read_state(tmp_path)["skipped"] == 4
    assert fleet.finish().splitlines()[0].endswith("; 4 bad input(s) skipped in steps.jsonl")
    assert lines == [] or all(line.startswith("agrpo fleet: ") for line in lines)
