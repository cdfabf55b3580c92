# `make test` and `make demo` set up everything they need, idempotently.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBS := prometheus chromium
SHELL := /bin/bash

.PHONY: setup test lint demo bench clean

setup: $(STAMP) debs

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Debian packages the real-component tests need; installed only when missing.
debs:
	@missing=""; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@command -v initdb >/dev/null || test -x /usr/lib/postgresql/15/bin/initdb || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql-15; }

lint: setup
	$(VENV)/bin/ruff check hub spoke tests bench

# Four workers: the tests wait on real processes far more than they compute (see pyproject).
test: setup
	$(VENV)/bin/ruff check hub spoke tests bench
	$(VENV)/bin/pytest -q -n 4

# The main job: a local multi-cluster fleet end to end (hub, agents, exporters, sync,
# reconcile, report), every process stopped at the end.
demo: setup
	$(VENV)/bin/gpufleet demo

bench: setup
	$(PY) bench/sync_bench.py --gpus 1000
	$(PY) bench/sync_bench.py --gpus 100000
	$(PY) bench/usage_bench.py --pg auto
	$(PY) bench/exporter_bench.py
	$(PY) bench/serve_load.py --gpus 10000 --clients 50 --seconds 60 --pg auto

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
