# Two commands do all the set-up on a fresh machine:
#   make demo   - a 2-node training run (examples/ddp-cpu.yaml) on the local backend
#   make test   - the whole test suite; starts (and stops) the local SLURM cluster it needs
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch. A bare `torch` requirement would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test install cluster-up cluster-down bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[train,dev]"
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/halo-sched submit examples/ddp-cpu.yaml --backend local --wait

test: $(BIN)/.installed
	$(BIN)/pytest

cluster-up:
	tests/cluster/slurm-cluster.sh up

cluster-down:
	tests/cluster/slurm-cluster.sh down

bench: $(BIN)/.installed
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
