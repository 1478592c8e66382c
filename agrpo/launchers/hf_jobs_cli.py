"""Shim until agrpo/cli.py's SUBCOMMANDS points `jobs` at agrpo.launchers.hf_jobs.cli; then delete this file."""
from agrpo.launchers.hf_jobs.cli import main  # noqa: F401
