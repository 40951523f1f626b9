"""bench/scale.py's harness: the process-tree sampler counts a descendant's memory, and the
bench measures the tiny decoder (``scale_models.decoder(2, small=True)``) in fresh children
with figures that make sense (the 0.5B configs run in bench/ only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

MB = 1024  # kB


def test_tree_sampler_counts_a_grandchilds_memory():
    """A child that starts a grandchild holding 200 MB: the tree's peak has the 200 MB, and
    each process's own VmHWM is summed."""
    from scale_tree import TreeSampler, read_tree

    grandchild = "b = b'\\x01' * (200 << 20); import time; time.sleep(30)"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = TreeSampler(proc.pid).start()
    try:
        sampler.arm()
        end = time.monotonic() + 20
        while sampler.peak_kb < 200 * MB and time.monotonic() < end:
            time.sleep(0.1)
        reading = read_tree(proc.pid)
        sampler.disarm()
    finally:
        sampler.stop()
        for pid in read_tree(proc.pid).pids[::-1]:  # the grandchild first, then ours
            subprocess.run(["kill", "-9", str(pid)], check=False)
        proc.wait(timeout=10)
    assert len(reading.pids) == 2, reading
    assert sampler.peak_kb >= 200 * MB, sampler
    assert sampler.hwm_kb >= 200 * MB and sampler.procs == 2, sampler
    assert reading.rss_sum_kb >= reading.kb - 1 * MB  # shared pages counted once, not less


def test_scale_bench_measures_the_tiny_decoder(tmp_path):
    """Export and compare, wb and bare, each in its own child: every job ran, the figures
    are in the JSON and sane (positive times and ratios, peaks at least the start, which
    holds the model), the bare export went through the workbench's diff rewriter, and the
    workspace is removed at the end."""
    out = tmp_path / "scale.json"
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--layers", "2", "--small", "--no-cnn",
         "--tokens", "8", "--stages", "export,compare", "--json", str(out),
         "--workdir", str(work)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = proc.stdout
    assert "decoder-2L compare wb:" in text and "summary:" in text, text[-2000:]
    data = json.loads(out.read_text())
    jobs = data["jobs"]
    assert [(j["stage"], j["side"]) for j in jobs] == [
        ("export", "wb"), ("export", "bare"), ("compare", "wb"), ("compare", "bare")]
    for j in jobs:
        assert j["ok"], j
        assert j["seconds"] > 0 and j["samples"] >= 1, j
        assert j["start_kb"] > 100 * MB, j  # torch and the model are resident at the start
        assert j["peak_kb"] >= j["start_kb"] >= j["model_bytes"] / 1024, j
    wb_export, bare_export, wb_compare, bare_compare = jobs
    assert wb_export["procs"] == 2  # the workbench's worker counted in the tree
    assert bare_export["result"]["rewriters"] == ["workbench.diff"]
    assert bare_compare["result"]["runs_s"] > 0
    assert set(bare_compare["result"]["times"]) == {"torch run", "ort0 create", "ort0 run"}
    assert set(wb_compare["result"]["aligned"]) and all(
        0 < v <= 1 for v in wb_compare["result"]["aligned"].values())
    figures = {f["figure"]: f for f in data["figures"]}
    assert set(figures) == {f"decoder-2L {s} {k} wb/bare" for s in ("export", "compare")
                            for k in ("time", "peak")}
    for f in figures.values():
        assert f["value"] > 0 and f["met"] in (True, False), f
        assert (("target met" if f["met"] else "NOT met") in
                next(ln for ln in text.splitlines() if ln.strip().startswith(f["figure"])))
    assert data["end_to_end"]["model"] == "decoder-2L" and not data["end_to_end"]["complete"]
    assert not work.exists()


def test_tree_sampler_calls_the_low_memory_guard_once():
    """Below the floor of MemAvailable the guard is called once, with what is available
    (the bench then stops its job before the OOM killer picks a process)."""
    from scale_tree import TreeSampler, mem_available_kb

    calls = []
    sampler = TreeSampler(os.getpid(), floor_kb=mem_available_kb() * 4,
                          on_low_memory=calls.append).start()
    try:
        end = time.monotonic() + 5
        while not calls and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.1)
    finally:
        sampler.stop()
    assert len(calls) == 1 and calls[0] > 0 and sampler.low_memory_kb == calls[0]
