"""runtime/heap.py: glibc's heap policies, measured by the page faults they spare (each in a
fresh process: a policy changes the process it is set in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.runtime import heap

pytestmark = pytest.mark.skipif(heap._libc() is None, reason="glibc only")

# eight 20 MB blocks written, freed, written again: a later round's page faults say whether
# the earlier round's memory was kept (glibc's defaults trim the freed 160 MB off the heap
# top); then the process's anonymous memory after the policy is over
PROBE = r"""
import json, resource, sys
from workbench.runtime.heap import heap_held

N = 20 << 20

def faults():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [b"\x01" * N for _ in range(8)]  # malloc(N), every page written
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10

out = {"plain": [faults(), faults(), faults()]}
with heap_held() as applied:
    out["held"] = [faults(), faults()]
    out["applied"], out["anon_held"] = applied, anon()
out["anon_after"], out["after"] = anon(), [faults()]
print(json.dumps(out))
"""


def probe(**extra):
    """PROBE's figures, in a process started with no malloc settings in its environment
    but ``extra`` (dask's nanny leaves MALLOC_TRIM_THRESHOLD_ in os.environ after a sweep's
    test)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"} | extra
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    return json.loads(run.stdout)


def test_heap_held_keeps_freed_blocks_then_hands_them_back():
    out = probe()
    pages = (160 << 20) // 4096
    assert out["applied"] is True
    # glibc's defaults: every round faults its pages in again (mapped, or trimmed off)
    assert min(out["plain"]) > pages * 0.9
    # held: the second round reuses the first's heap memory
    assert out["held"][1] < pages * 0.05
    assert out["anon_held"] >= 150 << 20  # the freed blocks are still the process's
    # afterwards malloc_trim handed it back
    assert out["anon_after"] < out["anon_held"] - (64 << 20)


def test_heap_held_applies_after_dask_set_its_trim_threshold():
    """dask's nanny puts MALLOC_TRIM_THRESHOLD_=65536 in os.environ before it spawns a
    worker; processes started after it carry it. The export's policy still applies there."""
    out = probe(MALLOC_TRIM_THRESHOLD_="65536")
    pages = (160 << 20) // 4096
    assert min(out["plain"]) > pages * 0.9  # glibc read the setting: every round faulted
    assert out["applied"] is True and out["held"][1] < pages * 0.05
