# PockEngine: `make demo` and `make test` each set everything up on a fresh
# Debian machine (system packages when run as root, then .venv) and run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PACKAGES := g++ cmake make

.PHONY: setup sysdeps demo test bench clean

setup: sysdeps $(STAMP)

sysdeps:
	@bash scripts/install_sysdeps.sh $(APT_PACKAGES)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) -m pockengine.demo

test: setup
	$(PY) -m pytest -n 2 -q tests

clean:
	rm -rf $(VENV) build *.egg-info
