"""Which huggingface_hub line the tests run under: 2.x in `make test`, 1.x in `make test-gpu-versions` (docs/gpu.md).
A test that needs a 2.x-only argument says so; what agrpo does under 1.x instead is tested in tests/test_hub_compat.py."""

from __future__ import annotations

import huggingface_hub
import pytest

HUB_2 = int(huggingface_hub.__version__.split(".")[0]) >= 2
# The body HfApi.create_bucket(private=True) sends: 2.x names a visibility, 1.x a flag.
PRIVATE_BUCKET_BODY = {"visibility": "private"} if HUB_2 else {"private": True}
# The body HfApi.run_job(expose=[8000]) sends: 2.x adds the (empty) public ports.
EXPOSE_8000_BODY = {"ports": [8000], "portsPublic": []} if HUB_2 else {"ports": [8000]}
# Skips on the 1.x line only (the GPU-versions lane; tests/allowed_skips.toml names that condition). Under 2.x the
# marked tests run: a release that drops or renames run_job(attempts=) fails them, and tests/test_hub_compat.py
# names the missing argument, instead of the Jobs rehearsal e2e module going quietly unrun.
needs_run_job_attempts = pytest.mark.skipif(
    not HUB_2,
    reason=f"HfApi.run_job(attempts=) exists from huggingface_hub 2.0 (installed {huggingface_hub.__version__}); "
    "under 1.x agrpo refuses launcher.hf_jobs.trainer_attempts > 1 (tests/test_hub_compat.py)",
)
