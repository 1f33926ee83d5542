# The two commands: `make demo` and `make test`. Both work on a fresh machine with only python3.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

DIST_DIR ?= dist
CONSTRAINTS := deploy/constraints-worker.txt
# The CuPy whose headers the kernel tests compile against: the GPU machine's version.
CUPY_HEADERS := 14.2.0

.PHONY: demo test lint bench browser slurm dist constraints clean

# The runtime dependencies at the versions pinned for the cluster's workers, so the tests
# run what a facility installs.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,fftw]' -c $(CONSTRAINTS)
	# Ptychodus is the judge of our product files (tests only); its api modules import
	# scikit-image, and its own pins are not ours, hence --no-deps.
	$(BIN)/python -m pip install -q --no-deps ptychodus==1.7.0
	$(BIN)/python -m pip install -q scikit-image
	# CuPy's C++ headers, for NVRTC (the [dev] extra) to compile the element-wise kernels'
	# bodies on any machine (tests/ptycho/gpu/test_gpu_kernels.py). Beside the venv's site-packages, not
	# in it: CuPy stays unimportable, so the suite runs as on a host without a card.
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/cupy-headers \
		cupy-cuda12x==$(CUPY_HEADERS)
	touch $@

# Debian's Chromium for the real-browser tests of the status page (never a browser download).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
		|| echo "warning: could not install chromium; browser tests will be skipped"; \
	elif sudo -n true 2>/dev/null; then \
		(sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
		|| echo "warning: could not install chromium; browser tests will be skipped"; \
	else echo "warning: no /usr/bin/chromium and no root; browser tests will be skipped"; fi

# Debian's Slurm and MUNGE for the one-node-cluster test (tests/flows/test_slurm.py), which runs
# the daemons as root: installed as root only (the test installs them too when missing).
SLURM_BINS := /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/sbatch
slurm:
	@if ls $(SLURM_BINS) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends slurm-wlm munge) >/dev/null \
		|| echo "warning: could not install slurm-wlm and munge; the Slurm test will be skipped"; \
	else echo "warning: not root; the Slurm test will be skipped"; fi

lint: $(STAMP)
	$(BIN)/ruff check .

# The tests in parallel (tests/conftest.py: two workers per CPU, as most tests wait), each
# module's tests on one worker in their order; the slowest 15 and the suite's time against
# its budget, 5 minutes on an idle 2-CPU machine (docs/dev/TESTING.md).
test: $(STAMP) browser slurm
	$(BIN)/ruff check .
	$(BIN)/pytest -n auto --dist loadfile --no-loadscope-reorder --durations 15 --suite-budget 300

# Simulated beamline, edge agent, local flows, reconstruction and the status page, live;
# serves the page until Ctrl-C. DEMO_ARGS="--exit" returns when the runs are done.
demo: $(STAMP)
	$(BIN)/beamflow demo --workspace demo-workspace $(DEMO_ARGS)

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do $(BIN)/python $$b; done

# The install artifact: wheel and sdist of beamflow, the edge agent, the compute functions and
# the flow definitions (docs/deployment.md, "Install from the wheel"), built offline with
# the venv's hatchling.
dist: $(STAMP)
	$(BIN)/python -m hatchling build --directory $(DIST_DIR)

# deploy/constraints-worker.txt from the environment the tests pass in.
constraints: $(STAMP)
	$(BIN)/python -m beamflow.constraints > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) demo-workspace .pytest_cache .ruff_cache dist
