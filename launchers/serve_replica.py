"""Serve one vLLM replica of an agrpo config on this machine, with the flags `python -m agrpo` derives for it.

    python launchers/serve_replica.py --port 8000 +recipe=gsm8k [overrides...]

For replicas agrpo does not start itself (slurm_multi_node.sbatch): listens on 0.0.0.0 and execs the server;
with `launcher.dry_run=true` among the overrides it prints the command instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args, overrides = parser.parse_known_args(argv)
    from agrpo.config.prepare import prepare_overrides
    from agrpo.errors import AgrpoError
    from agrpo.inference.vllm_server import build_replica_launch

    try:
        # The run's validation and resolution (agrpo/config/prepare.py); a replica node needs none of the trainer's
        # data, rewards or packages, so the checks against this machine are the trainer's to run.
        cfg = prepare_overrides(overrides, output_dir=os.getcwd(), check_environment=False)
    except AgrpoError as error:
        print(f"serve_replica: error: {error}", file=sys.stderr)
        return error.exit_code
    cfg.inference.host = "0.0.0.0"  # the trainer reaches it from another node
    launch = build_replica_launch(cfg, args.port, cfg.inference.device, None, sys.executable)
    if cfg.launcher.dry_run:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
        print(f"replica on {os.uname().nodename}: {env} {shlex.join(launch.argv)}")
        return 0
    from agrpo.models.resolve import prepare_model

    prepare_model(cfg.model)
    os.execvpe(launch.argv[0], launch.argv, {**os.environ, **launch.env})
    return 1  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
