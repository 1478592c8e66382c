#!/usr/bin/env bash
# One-GPU check: train a recipe for a few steps with the trainer and one vLLM replica sharing the GPU, then write
# steps/s, generated tokens/s and adapter sync latency to a JSON file.
#
#   MODEL=/models/Qwen2.5-0.5B-Instruct DATA=/data/gsm8k/train.jsonl bash benchmarks/gpu_pipeline_check.sh [OUT_DIR]
#
# Needs: the project installed (make setup-gpu), the model in a local folder (or a Hub id with network access).
# DRY_RUN=1 composes and validates the same command and prints its plan (launcher.dry_run=true), starting nothing:
# how CI checks this script on a machine without a GPU (tests/benchmarks/test_benchmark_scripts.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu_pipeline_check_out}}
RECIPE=${RECIPE:-gsm8k}
STEPS=${STEPS:-20}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
RUN_DIR="$(cd "$OUT" && pwd)/run"
data_override=()
[ -n "${DATA:-}" ] && data_override=("data.path=$DATA")
if [ -n "${DRY_RUN:-}" ]; then
  exec "$PYTHON" -m agrpo "+recipe=$RECIPE" "model.name_or_path=$MODEL" "trainer.max_steps=$STEPS" \
    trainer.save_steps=0 "hydra.run.dir=$RUN_DIR" "${data_override[@]}" launcher.dry_run=true
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" || true
"$PYTHON" -m agrpo "+recipe=$RECIPE" "model.name_or_path=$MODEL" "trainer.max_steps=$STEPS" \
  trainer.save_steps=0 "hydra.run.dir=$RUN_DIR" "${data_override[@]}" 2>&1 | tee "$OUT/run.log"
"$PYTHON" - "$RUN_DIR" "$OUT/gpu_check.json" <<'PY'
import json, statistics, sys
from pathlib import Path

run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
history = json.loads((run_dir / "log_history.json").read_text())
def mean(key, skip=2):
    values = [entry[key] for entry in history if key in entry][skip:]
    return statistics.fmean(values) if values else None
step_s = mean("perf/step_s")
figures = {
    "steps": json.loads((run_dir / "metrics.json").read_text())["global_step"],
    "step_s": step_s,
    "steps_per_s": 1 / step_s if step_s else None,
    "generated_tok_s": mean("rollout/generated_tok_s"),
    "sync_publish_to_loaded_s": mean("sync/publish_to_loaded_s", skip=1),
    "weight_sync_s": mean("perf/weight_sync_s", skip=1),
    "reward_last": json.loads((run_dir / "metrics.json").read_text()).get("reward_last"),
    "gpu": (out.parent / "gpu.txt").read_text().strip() if (out.parent / "gpu.txt").exists() else None,
}
out.write_text(json.dumps(figures, indent=2))
print(json.dumps(figures, indent=2))
PY
