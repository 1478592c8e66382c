"""Reward functions. Each follows TRL's reward signature and is picklable (TRL scores in a spawned child)."""
