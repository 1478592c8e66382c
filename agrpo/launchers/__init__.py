"""Launchers: turn a composed config into a plan of processes, then run it and tear it down."""

from agrpo.launchers.base import LAUNCHERS, Launcher, get_launcher

__all__ = ["LAUNCHERS", "Launcher", "get_launcher"]
