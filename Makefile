# Two commands do all the set-up on a fresh machine:
#   make demo      - a 2-node training run (examples/ddp-cpu.yaml) on the local backend
#   make test      - the whole test suite; starts (and stops) the local SLURM cluster it needs
#   make test-fast - the tier without the SLURM cluster, real torchrun or long property runs
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch for the trainer side (examples/, preflight, the tests' real torchrun). From PyPI, on Linux
# x86_64, this is the CUDA build (several GB of nvidia-* wheels). For the CPU build, name
# PyTorch's CPU index: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (used for the torch install alone; by default only PyPI, and pip's own configuration, is asked).
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
# The fast tier: markers select it (pyproject.toml); its time on 2 cores is in the README (bench/suite_time.sh).
FAST_TESTS := not slurm and not torch and not long
# HashiCorp's HCL parser (WebAssembly, from npm) that the tests read every rendered Nomad job with.
HCL_PARSER := tests/hclparse/node_modules/@cdktf/hcl2json/package.json
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Python caches compiled modules (and pytest its assertion-rewritten tests) as it does by default,
# also where the environment says not to: with PYTHONDONTWRITEBYTECODE=1 each of the suite's
# thousands of Python processes compiled the checkout's modules again, and each pytest worker
# rewrote every test module (9 s of CPU per worker, 2.6 s cached; the CLI's start 15-20% more).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-slurm-matrix test-fast install hcl-parser completion-shells cluster-up cluster-down bench bench-failures clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH)"
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[train,dev]"
	touch $@

# Node.js from Debian's packages when missing, then the pinned parser (package-lock.json).
$(HCL_PARSER): tests/hclparse/package.json tests/hclparse/package-lock.json
	command -v node > /dev/null && command -v npm > /dev/null || \
		{ $(SUDO) apt-get update && $(SUDO) apt-get install -y nodejs npm; }
	cd tests/hclparse && npm ci --no-audit --no-fund
	touch $@

hcl-parser: $(HCL_PARSER)

# zsh and fish, which tests/test_completion.py runs the generated completion scripts in: from
# Debian's packages when missing (with CI=true those tests fail rather than skip without them).
completion-shells:
	@missing=; for sh in zsh fish; do command -v $$sh > /dev/null || missing="$$missing $$sh"; done; \
	[ -z "$$missing" ] || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $$missing; }

install: $(BIN)/.installed $(HCL_PARSER)

demo: $(BIN)/.installed
	$(BIN)/halo-sched submit examples/ddp-cpu.yaml --backend local --wait

# The SLURM suite runs against Debian 12's Slurm 22.05 (with everything else) and again against
# SLURM_RELEASE, a current release built once per machine from Debian's source package
# (tests/cluster/slurm-cluster.sh build; cached in /var/cache/halo-sched). tests/suite.sh runs three
# passes side by side, each on pytest-xdist workers: A (all but the SLURM cluster's tests, the
# multi-host rig's included) on SUITE_WORKERS, and the SLURM suite on 22.05 and on SLURM_RELEASE,
# each on RELEASE_WORKERS workers with a cluster each; the make fails if any failed.
SLURM_RELEASE ?= 24.11
# `make test-slurm-matrix`: the SLURM suite alone, then the multi-host rig's tests (its daemons the
# same release's), against each of these in turn.
SLURM_MATRIX ?= 22.05 24.11 26.05
# pytest-xdist workers: most of the suite waits (torchrun start-up, slurmd, timeouts), not computes.
# test-fast's; make test's pass A and each release's (seven tests at once: tests/suite.sh says why).
TEST_WORKERS ?= 4
SUITE_WORKERS ?= 3
RELEASE_WORKERS ?= 2

test: $(BIN)/.installed $(HCL_PARSER) completion-shells
	SLURM_RELEASE=$(SLURM_RELEASE) HALO_TEST_WORKERS=$(SUITE_WORKERS) HALO_RELEASE_WORKERS=$(RELEASE_WORKERS) \
		PYTEST=$(BIN)/pytest tests/suite.sh

test-slurm-matrix: $(BIN)/.installed $(HCL_PARSER)
	rc=0; for v in $(SLURM_MATRIX); do \
		echo "== the SLURM suite against Slurm $$v"; \
		HALO_SLURM_VERSION=$$v tests/cluster/slurm-cluster.sh build && \
		HALO_SLURM_VERSION=$$v HALO_CLUSTER_PER_WORKER=1 $(BIN)/pytest -n 2 --dist loadgroup -m "slurm and not multihost" || rc=$$?; \
		echo "== the multi-host rig's tests against Slurm $$v"; \
		HALO_SLURM_VERSION=$$v $(BIN)/pytest -m multihost || rc=$$?; \
	done; exit $$rc

test-fast: $(BIN)/.installed $(HCL_PARSER) completion-shells
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "$(FAST_TESTS)"

cluster-up:
	tests/cluster/slurm-cluster.sh up

cluster-down:
	tests/cluster/slurm-cluster.sh down

# TorchX, the bench's anchor, goes into .bench/torchx only: never into the project's environment.
.bench/torchx/torchx:
	$(BIN)/pip install --quiet --disable-pip-version-check --target .bench/torchx "torchx==0.7.0"

bench: $(BIN)/.installed .bench/torchx/torchx
	$(BIN)/python bench/run.py

# Recovery after a node fault and what the preflight gate saves (real torchrun, ~4 minutes on 2 cores).
bench-failures: $(BIN)/.installed
	$(BIN)/python bench/run.py --failures

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis tests/hclparse/node_modules
