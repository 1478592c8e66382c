"""agrpo: asynchronous GRPO training of LoRA adapters on vLLM replicas, from one Hydra config."""

__version__ = "0.1.0"
