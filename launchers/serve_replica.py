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
    import torch

    from agrpo.cli import expand_recipe_paths
    from agrpo.config.compose import compose_run_config
    from agrpo.inference.vllm_server import build_replica_launch, resolve_device

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from agrpo.errors import AgrpoError

    try:
        cfg = compose_run_config(expand_recipe_paths(overrides))
    except (AgrpoError, HydraException, OmegaConfBaseException) as error:
        print(f"serve_replica: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    cfg.inference.host = "0.0.0.0"  # the trainer reaches it from another node
    device = resolve_device(cfg.inference.device, torch.cuda.is_available())
    launch = build_replica_launch(cfg, args.port, device, None, sys.executable)
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
