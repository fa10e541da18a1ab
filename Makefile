# attnlab: `make demo` installs and runs the main job; `make test` installs and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU wheel lies on disk on machines without a GPU; pinning it first keeps pip from
# pulling a multi-GB CUDA build. GPU users: `make install TORCH=torch` (or your own build).
TORCH ?= torch==2.13.0
# Caches stay inside the project, never scattered in $$HOME.
export ATTNLAB_CACHE ?= $(CURDIR)/.cache
export HF_HOME := $(ATTNLAB_CACHE)/huggingface
export HF_DATASETS_OFFLINE ?= 1
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline
export WANDB_DIR := $(ATTNLAB_CACHE)/wandb
export WANDB_CACHE_DIR := $(ATTNLAB_CACHE)/wandb-cache
export WANDB_CONFIG_DIR := $(ATTNLAB_CACHE)/wandb-config
export WANDB_DATA_DIR := $(ATTNLAB_CACHE)/wandb-data
export MPLCONFIGDIR := $(ATTNLAB_CACHE)/matplotlib
export TORCHINDUCTOR_CACHE_DIR := $(ATTNLAB_CACHE)/inductor

.PHONY: install demo test test-slow lint bench reports corpus slurm-packages clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet -e ".[dev]" "$(TORCH)"
	touch $@

install: $(VENV)/.installed

# The main job: the four scale rules on the quick synthetic task, then their report.
demo: install
	mkdir -p multirun/scale_quick && \
	sweep=$$(mktemp -d multirun/scale_quick/$$(date +%Y-%m-%d_%H-%M-%S)-XXXX) && \
	$(VENV)/bin/attnlab-train -m experiment=scale_quick hydra.sweep.dir=$$sweep && \
	$(VENV)/bin/attnlab-report $$sweep

test: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/pytest

test-slow: install
	$(VENV)/bin/pytest -m slow

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: install
	$(PY) benchmarks/attention_speed.py

# Rebuild every experiments/<name>/report.md, figures and claims.json from the committed
# data/<name>/ runs (with claims.yaml where there is one).
reports: install
	for data in experiments/*/data/*; do \
	  folder=$${data%/data/*}; claims=; \
	  if [ -f $$folder/claims.yaml ]; then claims="--claims $$folder/claims.yaml"; fi; \
	  $(VENV)/bin/attnlab-report $$data --out $$folder $$claims || exit 1; \
	done

# The offline English–Spanish corpus (data=translation): two public-domain Bibles that
# Debian ships as SWORD modules, unpacked into the project cache.
SWORD := $(ATTNLAB_CACHE)/sword
corpus: $(SWORD)/usr/share/sword/mods.d
$(SWORD)/usr/share/sword/mods.d:
	mkdir -p $(SWORD)/debs
	cd $(SWORD)/debs && apt-get download sword-text-web sword-text-sparv
	for deb in $(SWORD)/debs/*.deb; do dpkg-deb -x $$deb $(SWORD); done

# Debian's SLURM (Slurm 22.05) and munge, for the `slurm` tests' throw-away local cluster
# (root; without them those tests skip, saying so).
slurm-packages:
	apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null || \
	  (apt-get update -qq && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null)

clean:
	rm -rf $(VENV) .cache outputs multirun .pytest_cache
