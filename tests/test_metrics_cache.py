"""The metrics kernel's numba cache, shared by fresh processes (sweep cells, test workers).

numba's cache save reads the index, writes it with the new entry, then writes the data file.
Two processes compiling two dtype pairs at once both read an empty index and both take data
file 1: the index can then send one dtype pair to the other's machine code, and every later
process fails that pair ("TypeError: can't unbox array", which compare reads as pairs not
measured). Here the window real timing leaves open for milliseconds is held open for
seconds (sleeps inside numba's save); the kernel's first run of a dtype pair holds a lock
across processes, so the cache stays right."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import itertools, sys, time
    import numpy as np
    from numba.core import caching

    dtype, start, s1, s2 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

    def save(self, key, data):  # numba's IndexDataCacheFile.save, with two sleeps
        overloads = self._load_index()
        time.sleep(s1)
        existing = set(overloads.values())
        for i in itertools.count(1):
            data_name = self._data_name(i)
            if data_name not in existing:
                break
        overloads[key] = data_name
        self._save_index(overloads)
        time.sleep(s2)
        self._save_data(data_name, data)

    caching.IndexDataCacheFile.save = save
    from workbench.comparison import metrics
    a = np.linspace(-1, 1, 1000).astype(dtype)
    b = (a + np.asarray(1e-3, dtype)).astype(dtype)
    time.sleep(max(0.0, start - time.time()))
    st = metrics._finite_stats(a, b, metrics.Tolerance(1e-3, 1e-4), 1e-12)
    print(dtype, st["max_abs"])
""")


def test_two_processes_compiling_the_kernel_at_once_leave_a_cache_others_can_load(tmp_path):
    script = tmp_path / "first_run.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))

    def start(dtype: str, at: float, s1: float, s2: float) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(script), dtype, str(at), str(s1), str(s2)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    at = time.time() + 8  # both imported by then: their compiles start together
    # float32 writes its data file 4 s late, float64 its index 2 s late: unlocked, the index
    # maps float64 to data file 1, which ends up holding float32's code
    procs = [start("float32", at, 0, 4), start("float64", at, 2, 0)]
    for p in procs:
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out
    for dtype in ("float64", "float32"):  # fresh processes load both from the cache
        p = start(dtype, 0, 0, 0)
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out
        assert abs(float(out.split()[-1]) - 1e-3) < 1e-6, out
