"""`agrpo eval +recipe=NAME [eval.adapter=PATH] [eval.k=4] [key=value ...]`: score a model on a test split.

The arguments are the training CLI's Hydra overrides, composed with the same config tree (so a recipe's model,
prompts, reward and replica settings are what the evaluation uses) plus the `eval.*` keys of
agrpo/config/schema.py. It is a subcommand rather than a Hydra app: it composes with Hydra's compose API, writes into
`eval.output_dir` (default outputs/eval/<run_name>/<date_time>) and returns an exit code. See docs/eval.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from agrpo.errors import AgrpoError

USAGE = __doc__.splitlines()[0].strip("`")


def output_dir(cfg) -> Path:
    """eval.output_dir, else outputs/eval/<run_name>/<date_time> under the working directory (as Hydra's run dirs)."""
    if cfg.eval.output_dir:
        return Path(cfg.eval.output_dir).expanduser().resolve()
    return Path("outputs", "eval", str(cfg.run_name), time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(f"usage: {USAGE}\n\n{__doc__.split(chr(10), 2)[2]}")
        return 0
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    # Rewards call math-verify with its timeouts off on purpose (docs/rewards.md); it warns on every call.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        from agrpo.cli import expand_recipe_paths
        from agrpo.config.compose import compose_run_config
        from agrpo.eval.runner import run_eval
        from agrpo.eval.scoring import render_table

        try:
            cfg = compose_run_config(expand_recipe_paths(list(argv)))  # +recipe= takes a YAML path too
        except (HydraException, OmegaConfBaseException) as error:
            print(f"agrpo eval: error: {error}", file=sys.stderr)
            return 2
        out = output_dir(cfg)
        cfg.sync.output_dir = str(out)
        summary = run_eval(cfg, out)
    except AgrpoError as error:
        if os.environ.get("AGRPO_DEBUG") == "1":
            raise
        print(f"agrpo eval: error: {error}", file=sys.stderr)
        return error.exit_code
    what = f"adapter {cfg.eval.adapter}" if cfg.eval.adapter else "base model"
    print(render_table(summary, f"agrpo eval: {cfg.run_name}, {cfg.model.name_or_path}, {what}"))
    print(f"\nper-problem results: {out / cfg.eval.results_file}\nsummary: {out / cfg.eval.summary_file}")
    OmegaConf.save(cfg, out / "config.yaml", resolve=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
