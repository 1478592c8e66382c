"""GPU-count requirements of the tests that start several vLLM replicas (issue 33: `make test` on a GPU machine).

On a CPU machine every replica runs on the CPU and these tests run. On a GPU machine each replica takes a GPU of its
own and the trainer one more (agrpo/launchers/gpus.py), so a test that starts R replicas needs R + 1 GPUs: with fewer
it is skipped, naming the count. These are the only skips the suite allows (tests/conftest.py: `requires` fails).
"""

from __future__ import annotations

import pytest


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(count: int) -> pytest.MarkDecorator:
    here = visible_gpus()
    return pytest.mark.skipif(
        0 < here < count,
        reason=f"needs {count} GPUs on a GPU machine (one per replica and the trainer's); this one has {here} GPU(s)",
    )
