# `make test` and `make demo` set up everything they need, idempotently.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBS := prometheus chromium
SHELL := /bin/bash

.PHONY: setup test lint demo bench clean debs apt-wait

setup: $(STAMP) debs

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# apt-get waits for another package manager (unattended-upgrades on a fresh machine, a second
# make) up to APT_LOCK_WAIT seconds, then stops with one clear line instead of failing at once.
APT_LOCK_WAIT ?= 300
APT_LOCKS ?= /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock
# exits non-zero while any of the locks is held (apt and dpkg take them with fcntl, as lockf does)
LOCK_FREE = python3 -c "import fcntl, sys; [fcntl.lockf(open(p, 'a'), fcntl.LOCK_EX | fcntl.LOCK_NB) for p in sys.argv[1:]]" $(APT_LOCKS) 2>/dev/null

apt-wait:
	@if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; waited=0; \
	until $$SUDO $(LOCK_FREE); do \
	  if [ $$waited -ge $(APT_LOCK_WAIT) ]; then \
	    echo "error: another package manager still holds the apt/dpkg lock after $(APT_LOCK_WAIT)s ($(APT_LOCKS)); let it finish (or raise APT_LOCK_WAIT) and run make again" >&2; \
	    exit 3; \
	  fi; \
	  [ $$waited = 0 ] && echo "waiting for another package manager to release the apt/dpkg lock (up to $(APT_LOCK_WAIT)s)" >&2; \
	  sleep 2; waited=$$((waited + 2)); \
	done

# Debian packages the real-component tests need; installed only when missing (MISSING_DEBS
# names them instead of looking), through .ci/install-debs.sh: no recommended packages,
# no service enabled or started, one line of output.
MISSING_DEBS ?=
debs:
	@missing="$(MISSING_DEBS)"; \
	if [ -z "$$missing" ]; then \
	  command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v initdb >/dev/null || test -x /usr/lib/postgresql/15/bin/initdb || missing="$$missing postgresql-15"; \
	fi; \
	if [ -n "$$missing" ]; then \
	  $(MAKE) --no-print-directory apt-wait || exit $$?; \
	  APT_LOCK_WAIT=$(APT_LOCK_WAIT) ./.ci/install-debs.sh $$(echo $$missing | tr ' ' '\n' | sort -u); \
	fi

VULTURE = $(VENV)/bin/vulture hub spoke tests bench .ci/vulture-whitelist.py \
	--exclude hub/inventory/migrations --min-confidence 60

lint: setup
	$(VENV)/bin/ruff check hub spoke tests bench
	$(VENV)/bin/python -m mypy
	$(VULTURE)

# ruff, mypy and vulture (dead code) are gates, not habits: a type error fails CI like a test does.
# Four workers: the tests wait on real processes far more than they compute (see pyproject).
test: setup
	$(VENV)/bin/ruff check hub spoke tests bench
	$(VENV)/bin/python -m mypy
	$(VULTURE)
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
