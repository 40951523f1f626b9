# Every target bootstraps .venv itself from this repository's own files.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo lab test lint clean browser-deps

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the local CPU wheel, not the registry's CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[lab,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/workbench demo

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/00-quickstart.ipynb

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The browser tests drive Debian Chromium through Playwright (pip extra `dev`); never
# `playwright install`: its downloaded browsers do not run here.
browser-deps:
	@test -x /usr/bin/chromium || { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; }

test: lint browser-deps
	$(PY) -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) workbench-runs test-artifacts
