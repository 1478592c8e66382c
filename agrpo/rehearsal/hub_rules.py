"""What the Hub's Jobs API refuses in a Job creation body (pure), so the stand-ins refuse it too.

Both stand-ins of the Hub API (the rehearsal's and the tests' fake Hub, which share hub_api.py) answer a body that
breaks one of these rules with 400 and the reason, as the Hub does, instead of running a Job the real service would
never start: a flavor that is not one of huggingface_hub's hardware names, label keys or values outside the Hub's tag
alphabet, a bucket volume whose bucket does not exist, a timeout or attempt count that is not a positive integer, a
port outside 1-65535. agrpo's own checks (agrpo/config/hf_jobs_checks.py) refuse each of these before anything is
uploaded; these rules are what makes a test fail if one of them is missing.
"""

from __future__ import annotations

import re
from typing import Any, Callable

TAG = re.compile(r"[A-Za-z0-9_-]+")  # Job names and labels are stored as tags: huggingface_hub's _sanitize_job_name
PRICE_UNIT = "minute"  # how the Hub's hardware list prices a flavor


def job_flavors() -> list[str]:
    """The hardware names huggingface_hub knows (kept in sync with the Hub API by huggingface_hub itself)."""
    from huggingface_hub import JobHardware

    return [flavor.value for flavor in JobHardware]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def volume_problems(volumes: Any, bucket_exists: Callable[[str], bool]) -> list[str]:
    problems = []
    for volume in volumes or []:
        source, mount = volume.get("source"), str(volume.get("mountPath") or "")
        if volume.get("type") != "bucket":
            problems.append(f"volume type {volume.get('type')!r} is not modelled here (buckets only)")
        elif not bucket_exists(str(source)):
            problems.append(f"bucket {source} does not exist (create it before mounting it)")
        if not mount.startswith("/"):
            problems.append(f"volume mountPath {mount!r} must be an absolute path")
    return problems


def job_spec_problems(spec: Any, bucket_exists: Callable[[str], bool]) -> list[str]:
    """Every reason the Jobs API would refuse this creation body; [] when it would accept it."""
    if not isinstance(spec, dict):
        return ["the body must be a JSON object"]
    problems = []
    if not (spec.get("dockerImage") or spec.get("spaceId")):
        problems.append("dockerImage (or spaceId) is required")
    command = spec.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        problems.append("command must be a non-empty list of strings")
    flavor = spec.get("flavor")
    if flavor not in job_flavors():
        problems.append(f"unknown flavor {flavor!r}: one of {', '.join(job_flavors())}")
    for key in ("environment", "secrets"):
        values = spec.get(key) or {}
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            problems.append(f"{key} must map names to strings")
    for key, value in (spec.get("labels") or {}).items():
        if not (TAG.fullmatch(str(key)) and isinstance(value, str) and TAG.fullmatch(value)):
            problems.append(f"label {key}={value!r}: keys and values may hold only letters, digits, '_' and '-'")
    for key in ("timeoutSeconds", "attempts"):
        if key in spec and not _positive_int(spec[key]):
            problems.append(f"{key}={spec[key]!r} must be a positive integer")
    ports = (spec.get("expose") or {}).get("ports") or []
    if not all(_positive_int(p) and p < 65536 for p in ports):
        problems.append(f"exposed ports {ports} must be TCP ports (1-65535)")
    return problems + volume_problems(spec.get("volumes"), bucket_exists)


def hardware_list(price_per_hour_usd: dict[str, float]) -> list[dict[str, Any]]:
    """The body of GET /api/jobs/hardware (what huggingface_hub's list_jobs_hardware parses), one entry per flavor
    that has a price, each priced per minute as the Hub prices them."""
    entries = []
    for name in job_flavors():
        if name not in price_per_hour_usd:
            continue
        per_minute = price_per_hour_usd[name] / 60
        gpu = not name.startswith("cpu")
        entries.append(
            {
                "name": name,
                "prettyName": name,
                "cpu": "?",
                "ram": "?",
                "accelerator": {"type": "gpu", "model": name, "quantity": "1", "vram": "?", "manufacturer": "?"}
                if gpu
                else None,
                "unitCostMicroUSD": round(per_minute * 1e6),
                "unitCostUSD": per_minute,
                "unitLabel": PRICE_UNIT,
            }
        )
    return entries
