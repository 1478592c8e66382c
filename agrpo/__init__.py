"""agrpo: asynchronous GRPO training of LoRA adapters on vLLM replicas, from one Hydra config."""

__version__ = "0.1.0"  # the one version number: pyproject.toml reads it (setuptools dynamic version)
