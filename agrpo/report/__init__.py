"""Reading a finished run: pictures of its curves (plot.py) and the metric sinks it can log to (loggers.py)."""
