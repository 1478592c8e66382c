"""vLLM replicas: the flags and environment derived from the config, and starting one for tests."""
