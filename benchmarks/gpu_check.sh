#!/usr/bin/env bash
# The trainer half on one GPU, for a machine that has torch (CUDA) and transformers but no vLLM, TRL or peft and no
# network (the lent device: one H200, torch 2.11+cu130, transformers 5.17, Python 3.12; at most 64 MiB of files):
#
#   bash benchmarks/gpu_check.sh prepare        # here, with pip and the package registries: wheels -> .gpu_wheels/
#   bash benchmarks/gpu_check.sh run [ARGS]     # there, from the repository root, .gpu_wheels/ carried along
#
# `prepare` downloads pure-Python wheels of what the device lacks (TRL, peft, datasets and its two helpers, Hydra,
# OmegaConf) for its Python, builds antlr4's (sdist only) and this package's, into the git-ignored .gpu_wheels/
# (about 5 MiB). `run` installs them with --no-deps into a fresh --target folder that goes first on PYTHONPATH, then
# runs benchmarks/gpu_check.py: a Qwen2.5-0.5B-shaped model built in code, trained with LoRA by TRL's
# AsyncGRPOTrainer on synthetic rollouts, one process per arm (FA3 bf16 where agrpo's attention choice allows it,
# SDPA bf16, SDPA fp32), printing one table of steps/s, tokens/s and peak memory. ARGS go to gpu_check.py
# (e.g. --steps 30 --json $OUT/gpu_check.json). About 3-5 minutes on an H200; without CUDA it runs the tiny preset
# on the CPU (how it is tested here). Untested on a GPU so far: see docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.gpu_wheels}
DEVICE_PYTHON_VERSION=${DEVICE_PYTHON_VERSION:-3.12}
PYTHON=${PYTHON:-python3}
# Versions: TRL's pin, and the tested minimums of the rest (constraints/minimum-versions.txt), which also run with
# the device's transformers 5.17 / huggingface_hub 1.33 in `make test-gpu-versions`.
PURE=(trl==1.16.0 peft==0.18.0 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 hydra-core==1.3.0 omegaconf==2.3.0)

prepare() {
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON_VERSION" \
    --implementation cp --platform any --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$WHEELS" "${PURE[@]}"
  "$PYTHON" -m pip wheel --quiet --no-deps -w "$WHEELS" "antlr4-python3-runtime==4.9.3"
  "$PYTHON" -m pip wheel --quiet --no-deps -w "$WHEELS" .
  du -sh "$WHEELS"
  ls "$WHEELS"
}

run() {
  local site
  site=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
  "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PYTHON" -c 'import torch, transformers, huggingface_hub as h; print(f"torch {torch.__version__} (CUDA '\
'{torch.version.cuda}), transformers {transformers.__version__}, huggingface_hub {h.__version__}")'
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 "$PYTHON" benchmarks/gpu_check.py "$@"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash benchmarks/gpu_check.sh prepare | run [gpu_check.py args]" >&2; exit 2 ;;
esac
