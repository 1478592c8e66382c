"""agrpo fleet up|down|status: one set of replicas that several runs share (issue 43, docs/shared_fleet.md).

  agrpo fleet up [NAME] +recipe=R [key=value ...]
      Start the recipe's replicas, the proxy (with tenancy) and, with inference.replicas=auto, the fleet controller;
      print `fleet NAME ready at URL` and stay in the foreground until Ctrl-C, SIGTERM or `agrpo fleet down NAME`,
      then stop them all and write <run dir>/fleet_summary.json. NAME defaults to `default`; the run dir is
      outputs/fleets/NAME/<date_time>_<pid> under the working directory. inference.shared.max_tenants sizes the
      replicas' LoRA slots; launcher.dry_run=true prints the plan.
  agrpo fleet status [NAME]
      The running fleets, their tenants, adapters and replica-seconds; records of fleets that are gone are removed.
  agrpo fleet down [NAME]
      Stop fleet NAME (SIGTERM) and wait up to 30 s until it is gone.

A run attaches with inference.shared_fleet=NAME: python -m agrpo +recipe=R inference.shared_fleet=NAME.
"""

from __future__ import annotations

import sys

COMMANDS = ("up", "down", "status")


def usage_error(message: str) -> int:
    print(f"agrpo fleet: error: {message} (agrpo fleet --help)", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return usage_error(f"unknown command {command!r}: use one of {', '.join(COMMANDS)}")
    if any(arg in ("-h", "--help") for arg in rest):
        print(__doc__.strip())
        return 0
    if command == "up":
        from agrpo.launchers.fleet_up import main as up_main

        return up_main(rest)
    if len(rest) > 1 or any("=" in arg or arg.startswith("-") for arg in rest):
        return usage_error(f"agrpo fleet {command} takes one fleet name at most, got {' '.join(rest)!r}")
    from agrpo.fleet.status import down_main, status_main

    if command == "status":
        return status_main(rest[0] if rest else None)
    return down_main(rest[0] if rest else "default")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
