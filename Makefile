# Two entry points for a fresh machine: `make reproduce` (default DAG to the PDF) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
TEX_PACKAGES := latexmk texlive-latex-recommended texlive-fonts-recommended texlive-latex-extra poppler-utils
CONTAINER_PACKAGES := podman runc debootstrap
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
export PATH := $(BIN):$(PATH)

.PHONY: setup tex container-tools container-image cuda-image browser slurm-tools kernel-tools quantized-tools quantized-peer reproduce paper remeasure report artifact-times paper-offline-smoke test test-fast bench lint clean
# Two pytest workers, a test file each at a time (its module fixtures built once), in the order
# tests/conftest.py gives: the file that first reads the default DAG before all others, so one
# worker builds the DAG (once for both, tests/once.py) while the other runs the rest.
PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder

setup: $(STAMP) tex

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "decodelab needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

# TeX for the paper: Debian/Ubuntu get it from apt; macOS users install MacTeX (see README).
tex:
	@command -v latexmk >/dev/null 2>&1 && command -v pdftoppm >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	    $$sudo apt-get update -qq && $$sudo apt-get install -y -qq $(TEX_PACKAGES); \
	  else \
	    echo "latexmk/pdftoppm not found: install TeX Live (macOS: brew install --cask mactex-no-gui; brew install poppler)"; \
	    exit 1; \
	  fi; }

reproduce: setup
	$(BIN)/snakemake

# Rules that only read what measurements wrote. `make paper` lets Snakemake run nothing else, so
# files of measuring rules (raw runs, models.csv, benchmarks) are taken as they are, even when
# results/models/ is absent: it never re-measures and never rebuilds a model.
PAPER_RULES := collect skipped statistics stability regimes regime_depth settings figures \
	speculative_stats speculative_figures verification_stats verification_figures reference_comparison \
	benchmark_summary merge_hosts paper all quantized_stats quantized_figures long_stats long_figures \
	batched_stats batched_figures selection verdicts

# Rebuild statistics, figures and the PDF from existing raw runs; never re-measures.
paper: setup
	$(BIN)/snakemake --allowed-rules $(PAPER_RULES)

# Re-measure only the jobs with an unstable configuration (results/*/stats/stability.csv, read by
# `decodelab remeasure`), then rebuild everything that reads them, the paper too; when the last
# build was quiet, nothing.
STABILITY_TABLES = $(wildcard results/*/stats/stability.csv)
remeasure: setup
	@[ -n "$(STABILITY_TABLES)" ] || { echo "make remeasure: no results/*/stats/stability.csv:" \
		"nothing measured yet (make reproduce)"; exit 1; }
	@files="$$($(BIN)/decodelab remeasure --stability $(STABILITY_TABLES))" && \
	if [ -z "$$files" ]; then echo "make remeasure: every configuration was stable; nothing to re-measure"; \
	else echo "make remeasure: re-measuring" $$files; $(BIN)/snakemake --forcerun $$files; fi

# An HTML report (figures and tables by category, rules, runtimes) of the finished DAG.
report: paper
	$(BIN)/snakemake --report results/report.html

# The per-rule time table of ARTIFACT.md, from the benchmark files of the runs here.
artifact-times: setup
	$(BIN)/snakemake --allowed-rules $(PAPER_RULES) results/combined/stats/benchmarks.csv
	$(BIN)/decodelab artifact-times --benchmarks results/combined/stats/benchmarks.csv

# Debian packages $(2) from apt as root unless the commands $(1) are all there; without apt or
# root nothing is installed, and the tests that need them are skipped, saying why.
apt_install_missing = @missing=; for c in $(1); do command -v $$c >/dev/null 2>&1 || missing=1; done; \
	[ -z "$$missing" ] || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" -ne 0 ] \
	|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); }

container-tools:
	$(call apt_install_missing,podman debootstrap,$(CONTAINER_PACKAGES))

# The CPU image (envs/cpu.Containerfile) built with Podman on a Debian base made here, for the
# container test (tests/test_containers.py, `pytest -m container`): Podman, runc and debootstrap
# from apt as root; about 4 minutes the first time, seconds after. Elsewhere the test is skipped.
container-image: setup container-tools
	@if command -v podman >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then \
	  envs/build-local.sh; \
	else \
	  echo "container-image: no podman/debootstrap and no apt as root: the container test is skipped"; \
	fi

# The CUDA image (envs/cuda.Containerfile) built the same way, with PyTorch's CUDA wheels from
# PyPI: 6.3 GB, about 6 minutes here. Not part of `make test` (too heavy); where it exists, the
# container test runs its CPU sweep in it too. No GPU run inside it is tested (envs/README.md).
cuda-image: setup container-tools
	envs/build-local.sh cuda

# The quantized backend (tests/test_quantized.py, config/quantized.yaml): llama-cpp-python,
# built from source once per machine (38 minutes measured on 2 cores shared with other work) into a wheel kept in
# ~/.cache/decodelab-wheels and reused after, and llama.cpp's converter from the same sdist.
LLAMA_CPP_PYTHON := 0.3.36
quantized-tools: $(STAMP)
	$(call apt_install_missing,cmake gcc g++,cmake build-essential)
	CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} scripts/quantized_tools.sh \
		$(BIN)/python $(LLAMA_CPP_PYTHON)

# llama.cpp's own speculative decoding, the quantized study's peer (config 'quantized.peer'):
# two programs compiled with ggml and llama again, about an hour on 2 shared cores, once per
# machine; not a step of `make test` (its two tests skip without it).
quantized-peer: quantized-tools
	CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} scripts/quantized_tools.sh \
		$(BIN)/python $(LLAMA_CPP_PYTHON) --peer

# Debian's Chromium, for the browser test of the report (tests/test_report_browser.py).
browser:
	$(call apt_install_missing,chromium,chromium)

# SLURM, munge and MariaDB for the cluster test (tests/test_slurm.py, `pytest -m slurm`), which
# starts a one-node cluster as root in a temporary directory and stops it after; about 3 minutes.
slurm-tools:
	$(call apt_install_missing,slurmctld slurmd slurmdbd munged mariadbd,$(SLURM_PACKAGES))

# Triton for the attention kernel's tests on the CPU, under its interpreter
# (tests/test_attention.py): a directory of its own, which only that test's subprocess imports.
# 3.9.0: 3.6.0's interpreter (the H100's Triton) cannot run a loop to a length given as argument.
TRITON := 3.9.0
kernel-tools: $(VENV)/triton/.installed
$(VENV)/triton/.installed: | $(STAMP)
	rm -rf $(VENV)/triton
	$(BIN)/python -m pip install --quiet --no-deps --target $(VENV)/triton triton==$(TRITON)
	touch $@

test: setup quantized-tools container-image browser slurm-tools kernel-tools
	$(BIN)/pytest $(PARALLEL) -m "not serial" --durations=40
	$(BIN)/pytest -m serial --durations=10

# Everything but the end-to-end, container, SLURM, LaTeX and slow tests.
test-fast: $(STAMP)
	$(BIN)/pytest $(PARALLEL) -m "not e2e and not container and not slurm and not latex and not slow"

# Our speculative decoding against HF assisted generation and plain decoding on the default pair,
# measured side by side in one process; ratios printed and written to results/bench/.
bench: setup
	$(BIN)/snakemake results/models/target results/models/draft
	$(BIN)/decodelab bench --target-dir results/models/target --draft-dir results/models/draft \
		--out results/bench/speculative.csv

# The paper profile's DAG offline (config/paper-offline.yaml) end to end to the PDF with shrunk
# amounts, in a copy under /tmp; not part of `make test` (ARTIFACT.md: The paper profile, offline).
paper-offline-smoke: setup
	scripts/paper_offline_smoke.sh $(SMOKE_DIR)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint

clean:
	rm -rf results/models results/paper .snakemake logs benchmarks
	find results -mindepth 1 -maxdepth 1 ! -name reference -exec rm -rf {} +
