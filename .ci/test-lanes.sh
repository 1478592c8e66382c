#!/usr/bin/env bash
# `make test` (the README's test command, and what CI runs: .ci/run): the suite in two lanes side by side, in a base
# folder of this invocation's own (docs/ci.md "The shape").
#   usage: .ci/test-lanes.sh <venv python>    (the Makefile passes it; GPU_VERSIONS=1 adds the GPU-versions lanes)
#
# vLLM lane (foreground, normal priority): every test marked vllm, one after another (two vLLM runs at once would
#   fight for the cores); with GPU_VERSIONS=1 then the GPU-versions end-to-end run (it starts vLLM too).
# rest lane (background): every other test, in a session of its own whose autogroup is nice 10. The kernel groups
#   processes by session for the CPU scheduler (/proc/sys/kernel/sched_autogroup_enabled) and `nice` ranks them only
#   within one session; every run a vLLM test starts has a session of its own, so a plain `nice 19` beside them took
#   half the machine. Nice 10 gives the lane about a tenth of a busy vLLM session's CPU (nice 19, a seventieth, would
#   starve its in-process timeouts), so its per-test limit is 2400 s: waiting for CPU is not a hang. With
#   GPU_VERSIONS=1 the GPU-versions environment is installed beside it, and `make test-gpu-versions-rest` follows.
#
# Private to this invocation: the base folder (mktemp -d; removed when both lanes pass, kept and named otherwise),
# and the tests' ports (each test holds agrpo's port locks on the ports it binds: tests/processes.py held_ports).
# So two `make test` on one machine never share a folder or a port.
set -uo pipefail
python=${1:?usage: .ci/test-lanes.sh <venv python>}
: "${GPU_VERSIONS_E2E:=tests/e2e/test_own_task.py}" "${GPU_VERSIONS:=0}"
base=$(mktemp -d "${TMPDIR:-/tmp}/agrpo-tests-XXXXXX")
gpu_stamp=.venv-gpu-versions/.agrpo-installed
echo "make test: this run's folder is $base"

rest_lane() {
  echo 10 > /proc/self/autogroup 2>/dev/null || echo "(no autogroup here: the rest lane runs at nice 19 only)"
  export PYTEST_ADDOPTS="--timeout=2400 ${PYTEST_ADDOPTS:-}"  # a later --timeout of the caller's wins
  local rc=0 setup=""
  if [ "$GPU_VERSIONS" = 1 ]; then
    nice -n 19 make "$gpu_stamp" > "$base/gpu-setup.log" 2>&1 &
    setup=$!
  fi
  time nice -n 19 "$python" -m pytest -q -p no:cacheprovider --basetemp="$base/rest" --durations=10 -m "not vllm" || rc=1
  if [ -n "$setup" ]; then
    if wait "$setup"; then
      time make test-gpu-versions-rest || rc=1
    else
      echo "installing the GPU-versions environment failed:"; cat "$base/gpu-setup.log"; rc=1
    fi
  fi
  return $rc
}
export -f rest_lane
export base python GPU_VERSIONS gpu_stamp
setsid -w bash -c rest_lane > "$base/rest.log" 2>&1 &
rest=$!
trap 'kill -- -$rest 2>/dev/null || true' EXIT  # its own session: stop it with this script

vllm_rc=0
time "$python" -m pytest -q -p no:cacheprovider --basetemp="$base/vllm" --durations=25 -m vllm --ignore="$GPU_VERSIONS_E2E" || vllm_rc=1
if [ "$GPU_VERSIONS" = 1 ]; then
  # The GPU-versions end-to-end run needs that environment: the rest lane installs it (minutes before this point).
  while [ ! -e "$gpu_stamp" ] && kill -0 "$rest" 2>/dev/null; do sleep 5; done
  if [ -e "$gpu_stamp" ]; then
    time make test-gpu-versions-e2e || vllm_rc=1
  else
    echo "the GPU-versions environment was never installed (see the rest lane below)"; vllm_rc=1
  fi
fi

rest_rc=0
wait "$rest" || rest_rc=1
trap - EXIT
echo "--- the tests that do not start vLLM (run beside them, in their own session):"
cat "$base/rest.log"
echo "--- lanes: vLLM $([ $vllm_rc -eq 0 ] && echo passed || echo FAILED), rest $([ $rest_rc -eq 0 ] && echo passed || echo FAILED)"
if [ $vllm_rc -eq 0 ] && [ $rest_rc -eq 0 ]; then
  rm -rf "$base"
else
  echo "kept for a look: $base (logs, each test's tmp_path under vllm/ and rest/)"
  exit 1
fi
