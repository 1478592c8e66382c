"""The rehearsal's knobs were `launcher.hf_jobs.rehearse*` before they got their own node (`rehearsal.*`): the old
spellings on the command line still work, each rewritten to the new key with a one-line note (pure)."""

from __future__ import annotations

RENAMED = {
    "launcher.hf_jobs.rehearse": "rehearsal.enabled",
    "launcher.hf_jobs.rehearse_dir": "rehearsal.dir",
    "launcher.hf_jobs.rehearse_listing_lag_s": "rehearsal.listing_lag_s",
    "launcher.hf_jobs.rehearse_negative_cache_s": "rehearsal.negative_cache_s",
}


def respell(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(overrides with every old rehearsal key renamed, one note per rename)."""
    out, notes = [], []
    for override in overrides:
        key, sep, value = override.partition("=")
        new = RENAMED.get(key)
        if sep and new:
            out.append(f"{new}={value}")
            notes.append(f"{key} is now {new}: read as {new}={value}")
        else:
            out.append(override)
    return out, notes
