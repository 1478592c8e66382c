"""Errors a user can act on. The CLI prints their message as one paragraph and exits non-zero, without a traceback."""


class AgrpoError(Exception):
    """Base of every user-facing error; `exit_code` is what the process returns."""

    exit_code = 1


class ConfigError(AgrpoError):
    """The composed config is invalid; the message names the keys to change."""

    exit_code = 2


class LaunchError(AgrpoError):
    """A process of the plan could not start or died (the message carries the tail of its log)."""
