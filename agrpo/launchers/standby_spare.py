"""A spare replica's process, started ahead as a standby (agrpo/inference/standby.py): `stand_by()` launches it to
import vLLM and wait, holding no device; `start()` then lets it serve (it writes the go file), or starts it cold when
there is no standby (it ended, it was stopped, it was never stood by). The go file's folder must be this user's and
closed to others' writes (the run's fleet folder is). The fleet controller counts a replica's
seconds from `start()`: a standby has no model, no KV cache and no GPU context, so it holds nothing a replica-hour
pays for (docs/elastic.md, "Standby spares")."""

from __future__ import annotations

from pathlib import Path

from agrpo.errors import LaunchError
from agrpo.inference.standby import GO_ENV
from agrpo.processes.managed import ManagedProcess
from agrpo.processes.private_dir import open_to_others_problem


class StandbyProcess(ManagedProcess):
    def __init__(self, *args, go_path: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.go_path = go_path
        self.waiting = False  # launched as a standby and not yet told to serve

    def stand_by(self) -> None:
        """Launch the standby (a fresh one: whatever is left of an earlier process is reaped first)."""
        self.go_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = open_to_others_problem(self.go_path.parent)
        if problem:  # the standby would refuse it too (agrpo/inference/standby.py)
            raise LaunchError(
                f"{self.name}'s standby go file {self.go_path} cannot be there: {problem}, so another user could "
                "start the replica; give the run a directory of your own (hydra.run.dir)"
            )
        self.go_path.unlink(missing_ok=True)
        cold_env, self.env = self.env, {**self.env, GO_ENV: str(self.go_path)}
        try:
            super().start()
        finally:
            self.env = cold_env
        self.waiting = True

    def standing_by(self) -> bool:
        """A standby is up and waiting: `start()` will be a go, not a boot."""
        return self.waiting and self.alive()

    def start(self, inherit_output: bool = False) -> None:
        if self.standing_by():
            self.waiting = False
            self.go_path.touch()
            return
        self.waiting = False
        super().start(inherit_output)  # cold: without GO_ENV the module serves at once

    def stop(self, timeout_s: float = 20.0) -> None:
        self.waiting = False
        super().stop(timeout_s)
