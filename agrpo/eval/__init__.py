"""Evaluation: `agrpo eval +recipe=NAME [eval.adapter=PATH]` scores the base model or a trained adapter (docs/eval.md)."""
