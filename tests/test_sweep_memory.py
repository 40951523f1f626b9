"""A cell past the memory limit is reported out of memory, not a dead cluster or a hang: its
whole process tree (not only the Dask worker's own process, which is all the nanny sees) is
held to the worker's memory_limit; a worker the nanny restarts for memory anyway is said the
same way. On a real LocalCluster each: 1 worker process, 1 thread, memory_limit 1.5 GB."""

from __future__ import annotations

import os
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import workbench as wb
from workbench.errors import InputError
from workbench.sweeps import memory

NETS = textwrap.dedent("""
    import os, sys, time

    def tiny():
        import torch
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU())
        return net.eval(), (torch.rand(1, 3, 8, 8),)

    def hog():  # takes memory 64 MB at a time, up to 4 GB, in the cell's own process
        import numpy as np
        held = []
        for _ in range(64):
            held.append(np.ones(64 * 2**20, np.uint8))
            time.sleep(0.01)
        return tiny()

    def _folder_of(size):  # sparse: no disk used, but its tar holds `size` in the worker
        folder = os.path.dirname(os.path.abspath(sys.argv[1]))
        with open(os.path.join(folder, "weights.bin"), "wb") as f:
            f.truncate(size)
        raise RuntimeError("made a big folder")

    def big_folder():  # fits the worker's room, but its tar and the tar's copy do not
        _folder_of(2**30)

    def huge_folder():  # more than the worker's room: it cannot come back at all
        _folder_of(3 * 2**30)
""")
LEAN = {"simplify": ["none"], "raise": [False], "ncnn": ["none"]}


@pytest.fixture
def client(tmp_path):
    import dask
    from distributed import Client, LocalCluster

    # the worker's temp folders (a cell's folder before it goes back) in this test's folder:
    # a worker killed for memory leaves its own behind
    spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ"), "TMPDIR": str(tmp_path)}
    # the nanny, in this process, sets pre-spawn-environ in os.environ: put TMPDIR back after,
    # or every later test of this pytest worker makes its temp files here (Chromium's
    # singleton socket path then passes its length limit and the browser tests fail)
    saved, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                              "distributed.nanny.pre-spawn-environ": spawn}), \
                LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                             memory_limit="1.5GB", dashboard_address=None) as cluster, \
                Client(cluster) as c:
            yield c
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = saved_tempdir


def test_a_cell_past_the_workers_memory_limit_is_out_of_memory_and_the_rest_run(
        tmp_path, client):
    nets = tmp_path / "nets.py"
    nets.write_text(NETS)
    t0 = time.perf_counter()
    res = wb.sweep([f"{nets}:hog", f"{nets}:tiny"], LEAN, workspace=tmp_path / "ws",
                   client=client, progress=False)
    assert time.perf_counter() - t0 < 90
    by = {c.name: c for c in res.cells}
    hog = by["hog"]
    assert hog.status == "out-of-memory", res.table()
    assert hog.attempts == 1  # stopped, not a lost worker
    row = next(s for s in hog.stages if s.status == "out-of-memory")
    assert row.stage == "model" and row.error_class == "NotEnoughMemory"
    assert "memory_limit" in row.error and "GiB used" in row.error and "memory_limit" in row.hint
    assert by["tiny"].status == "ok", res.table()
    # the worker was never restarted: the same one ran both cells, and it is alive
    assert hog.worker == by["tiny"].worker in client.scheduler_info()["workers"]
    assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3


def test_a_worker_its_nanny_restarts_for_memory_is_said_as_out_of_memory(tmp_path, client):
    nets = tmp_path / "nets.py"
    nets.write_text(NETS)
    res = wb.sweep([f"{nets}:big_folder"], LEAN, workspace=tmp_path / "ws", client=client,
                   progress=False)
    cell = res.cells[0]
    assert cell.status == "out-of-memory" and cell.attempts == 2
    row = cell.stages[0]
    assert "nanny restarted it" in row.error and "shared=" in row.hint
    client.wait_for_workers(1, timeout=120)  # the nanny brought it back (seen: 2 s, once >60)
    assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3


def test_a_cell_folder_larger_than_the_workers_room_stays_there_and_the_worker_lives(
        tmp_path, client):
    nets = tmp_path / "nets.py"
    nets.write_text(NETS)
    before = set(client.scheduler_info()["workers"])
    with pytest.warns(UserWarning, match="stayed on the worker"):
        res = wb.sweep([f"{nets}:huge_folder"], LEAN, workspace=tmp_path / "ws",
                       client=client, progress=False)
    cell = res.cells[0]
    assert cell.status == "failed" and "made a big folder" in cell.stages[0].error
    assert cell.attempts == 1 and set(client.scheduler_info()["workers"]) == before
    kept = Path(cell.folder)
    assert kept.parts[-2] == "wb-cells-kept" and (kept / "weights.bin").stat().st_size == 3 * 2**30


def test_a_local_sweep_takes_a_memory_limit_and_refuses_a_bad_one(tmp_path):
    assert memory.given_limit("500MB").bytes == 500_000_000
    with pytest.raises(InputError) as e:
        wb.sweep(["workbench.zoo:resnet"], {}, workspace=tmp_path / "ws",
                 memory_limit="lots", progress=False)
    assert "memory_limit='lots'" in e.value.message and "'8GB'" in e.value.hint
