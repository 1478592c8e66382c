"""Every lower bound pyproject.toml declares is a tested version: constraints/minimum-versions.txt and
constraints/gpu-versions.txt pin exactly those bounds, and `make test-gpu-versions` installs and runs them. Inside
that environment (AGRPO_PINNED_ENV=1, set by the Makefile) the installed versions are checked against the pins."""

from __future__ import annotations

import os
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = ("constraints/gpu-versions.txt", "constraints/minimum-versions.txt")


def pins() -> dict[str, Version]:
    found = {}
    for name in CONSTRAINTS:
        for line in (REPO / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                requirement = Requirement(line)
                (spec,) = requirement.specifier
                assert spec.operator == "==", f"{name}: {line} is not an exact pin"
                key = canonicalize_name(requirement.name)
                assert key not in found, f"{requirement.name} is pinned twice"
                found[key] = Version(spec.version)
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def lower_bound(requirement: Requirement) -> Version | None:
    for spec in requirement.specifier:
        if spec.operator == ">=":
            return Version(spec.version)
        if spec.operator == "==":
            return Version(spec.version.removesuffix(".*"))
    return None


def test_every_declared_lower_bound_is_pinned_in_the_tested_environment():
    pinned = pins()
    for requirement in declared():
        bound = lower_bound(requirement)
        assert bound is not None, f"{requirement} declares no lower bound"
        key = canonicalize_name(requirement.name)
        assert key in pinned, f"{requirement.name}'s lower bound {bound} is tested nowhere: pin it in {CONSTRAINTS[1]}"
        assert pinned[key].release[: len(bound.release)] == bound.release, (
            f"pyproject declares {requirement}, the tested environment pins {requirement.name}=={pinned[key]}: "
            "raise the declared bound to what is tested (or pin the bound)"
        )
        assert requirement.specifier.contains(pinned[key], prereleases=True)


def test_the_gpu_extra_asks_for_the_kernels_version_transformers_wants():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = [Requirement(text) for text in extras["gpu"]]
    assert {r.name for r in gpu} == {"vllm", "transformers"}
    assert [r.extras for r in gpu if r.name == "transformers"] == [{"kernels"}]
    (vllm,) = [r.specifier for r in gpu if r.name == "vllm"]
    assert vllm.contains("0.31.0") and not vllm.contains("0.32.0"), "the gpu extra left TRL 1.16's range (0.22-0.31)"


@pytest.mark.skipif(os.environ.get("AGRPO_PINNED_ENV") != "1", reason="only inside `make test-gpu-versions`")
def test_the_pinned_environment_holds_exactly_the_pins():
    for name, pinned in pins().items():
        assert Version(version(name)) == pinned, f"{name} {version(name)} installed, {pinned} pinned"
