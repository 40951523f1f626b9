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


def probe(**env):
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60, check=True)
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


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "2"},
                                 {"MALLOC_TRIM_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}])
def test_the_users_own_malloc_settings_win(env):
    out = probe(**env)
    assert out["applied"] is False
    assert min(out["held"]) > (160 << 20) // 4096 * 0.9  # nothing changed: faulted again
    assert heap.user_tuned(env) and not heap.user_tuned({"MALLOC_PERTURB_": "1"})
