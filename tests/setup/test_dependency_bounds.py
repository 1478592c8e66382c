"""Every lower bound pyproject.toml declares is pinned in constraints/minimum-versions.txt (`make
test-minimum-versions` installs and runs it), and the GPU set-up's resolution (constraints/gpu-versions.txt, CI's
GPU-versions lane: `make test-gpu-versions`) is within every declared range. Inside a pinned environment
(AGRPO_PINNED_ENV=1; AGRPO_PINNED_FILE names its file, the GPU one unless set) the installed versions are checked
against its pins."""

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
GPU_VERSIONS, MINIMUMS = "constraints/gpu-versions.txt", "constraints/minimum-versions.txt"
CONSTRAINTS = (GPU_VERSIONS, MINIMUMS)


def pins(*names: str) -> dict[str, Version]:
    found = {}
    for name in names:
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
    pinned = pins(MINIMUMS)
    for requirement in declared():
        bound = lower_bound(requirement)
        assert bound is not None, f"{requirement} declares no lower bound"
        key = canonicalize_name(requirement.name)
        assert key in pinned, f"{requirement.name}'s lower bound {bound} is tested nowhere: pin it in {MINIMUMS}"
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


def test_the_gpu_resolution_is_within_every_declared_range():
    """The versions a GPU user gets satisfy pyproject (a resolution outside them would mean a stale file)."""
    pinned = pins(GPU_VERSIONS)
    for requirement in declared():
        key = canonicalize_name(requirement.name)
        if key in pinned:
            assert requirement.specifier.contains(pinned[key], prereleases=True), (requirement, pinned[key])
    assert {"transformers", "huggingface-hub", "peft", "accelerate", "datasets", "trl", "torch"} <= set(pinned)


@pytest.mark.skipif(os.environ.get("AGRPO_PINNED_ENV") != "1", reason="only inside `make test-gpu-versions`")
def test_the_pinned_environment_holds_exactly_the_pins():
    for name, pinned in pins(os.environ.get("AGRPO_PINNED_FILE", GPU_VERSIONS)).items():
        installed = Version(Version(version(name)).public)  # torch 2.13.0+cpu is the pin 2.13.0's CPU build
        assert installed == pinned, f"{name} {version(name)} installed, {pinned} pinned"
