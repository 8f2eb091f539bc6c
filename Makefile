# Set-up on a fresh machine is two commands: `make book` and `make test`.
# Both create .venv from the pinned requirements.txt when it is missing or out of date.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# make book QUICK=1            smoke profile from data/params.yaml (fast iteration)
# make book FORCE=chapters/x   re-execute the notebooks under a path even if unchanged
# make book JOBS=1             notebooks executed at once (default: number of cores)
BUILD_ARGS := $(if $(QUICK),--quick) $(if $(FORCE),--force $(FORCE)) $(if $(JOBS),--jobs $(JOBS))
# make test AUDIT_ARGS=--require-browser   fail instead of skipping when Chromium is missing
AUDIT_ARGS ?=

.PHONY: help venv book test unit audit data lab clean bench bundle
help:
	@echo "make book   execute the notebooks (papermill) and build the site into _build/html"
	@echo "make test   unit and claims tests, build the book, then audit the site"
	@echo "make lab    open the notebooks in JupyterLab from the pinned environment"
	@echo "make data   copy the last build's result tables to data/results (on purpose)"
	@echo "make bench  benchmarks vs baselines into data/results/bench (QUICK=1: smoke run, _build/bench)"
	@echo "make bundle one zip to take away: site, executed notebooks, requirements, PDF"
	@echo "make clean  remove _build"

venv: $(STAMP)

# Reinstall when the pins or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

book: $(STAMP)
	$(PY) -m bookbuild build $(BUILD_ARGS)

unit: $(STAMP)
	$(PY) -m pytest -q

audit: $(STAMP)
	$(PY) -m bookbuild audit $(AUDIT_ARGS)

# Unit, property and claims tests first (fast feedback), then the build tooling's slow tests
# on a small fixture book, then the book and its offline bundle, then the site audits.
test: $(STAMP)
	$(PY) -m pytest -q
	$(PY) -m pytest -q -m slow tests/tooling
	$(PY) -m bookbuild build $(BUILD_ARGS)
	$(PY) -m bookbuild bundle
	$(PY) -m bookbuild audit $(AUDIT_ARGS)

data: $(STAMP)
	$(PY) -m bookbuild data

# Ratios ours/baseline measured interleaved in one process, then the book build's timing.
# QUICK=1 uses small sizes and writes _build/bench/, never the committed data/results/bench/.
bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(if $(QUICK),--quick)

# The site (built first, like `make book`), the executed notebooks, requirements.txt and a
# PDF printed by headless Chromium, zipped into _build/bundle/how-many-heads-make-an-ssm.zip.
bundle: $(STAMP)
	$(PY) -m bookbuild build $(BUILD_ARGS)
	$(PY) -m bookbuild bundle

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=.

clean:
	rm -rf _build
