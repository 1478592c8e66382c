"""Shim until tests/sync/test_bucket_store.py imports agrpo.launchers.hf_jobs.client; then delete this file."""
from agrpo.launchers.hf_jobs.client import make_api  # noqa: F401
