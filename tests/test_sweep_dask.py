"""The sweep on a real Dask cluster: a LocalCluster of 2 worker processes (1 thread each) runs
the cells; artifacts come back to the workspace (or stay on a shared path); a scheduler that
does not answer is a hinted error within the connect timeout."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from test_sweep import FACTORIES

import workbench as wb
from workbench.errors import InputError
from workbench.sweeps.db import SweepDB


@pytest.fixture(scope="module")
def client():
    import dask
    from distributed import Client, LocalCluster

    # a task whose worker dies is given up at once (KilledWorker) rather than after 3 deaths:
    # the sweep's own single retry is then what the test sees
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_cells_run_on_the_cluster_and_their_artifacts_come_back(tmp_path, client):
    nets = tmp_path / "nets.py"
    nets.write_text(FACTORIES)  # no "fixed" file beside it: flaky fails
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    res = wb.sweep([f"{nets}:tiny", f"{nets}:flaky"], {"exporter": ["torchscript"]},
                   workspace=ws, client=client, progress=False)
    assert res.where.startswith("dask tcp://") and res.ran == 2
    workers = set(client.scheduler_info()["workers"])
    by = {c.name: c for c in res.cells}
    assert {by["tiny"].worker, by["flaky"].worker} <= workers
    assert by["tiny"].status == "ok" and by["flaky"].status == "failed"
    assert "not fixed yet" in by["flaky"].stages[0].error and by["flaky"].stages[0].hint
    folder = Path(by["tiny"].folder)
    assert folder.parent == ws / "cells"  # unpacked into the workspace
    assert (folder / "0001-export" / "model.onnx").is_file()
    assert any(folder.glob("*-ncnn/*.ncnn.param"))
    ncnn = next(s for s in by["tiny"].stages if s.stage == "ncnn")
    assert ncnn.status == "ok" and ncnn.aligned_fraction > 0.5
    # the same sweep with --shared: the failed cell reruns, its files stay on the shared path
    retried = wb.sweep([f"{nets}:tiny", f"{nets}:flaky"], {"exporter": ["torchscript"]},
                       workspace=ws, client=client, shared=shared, retry_failed=True,
                       progress=False)
    assert retried.ran == 1
    flaky = next(c for c in retried.cells if c.name == "flaky")
    assert Path(flaky.folder).parent == shared / "cells"
    assert (Path(flaky.folder) / "cell.log").is_file() and flaky.attempts == 2
    with SweepDB(ws, readonly=True) as db:
        assert db.integrity() == "ok"


def test_a_worker_lost_mid_cell_is_retried_once_and_the_attempts_reported(tmp_path, client):
    nets = tmp_path / "nets.py"
    nets.write_text(FACTORIES)
    res = wb.sweep([f"{nets}:kills_its_worker"], {}, workspace=tmp_path / "ws", client=client,
                   progress=False)
    cell = res.cells[0]
    assert (tmp_path / "worker-killed").exists()  # the first attempt killed its worker
    assert cell.attempts == 2  # ...and the second ran to the factory's own error
    assert cell.status == "failed" and "second attempt ran" in cell.stages[0].error
    client.wait_for_workers(2, timeout=60)  # the nanny restarted it


def test_a_scheduler_that_does_not_answer_is_a_hinted_error_not_a_hang(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        wb.sweep(["workbench.zoo:resnet"], {}, workspace=tmp_path / "ws",
                 scheduler=f"tcp://127.0.0.1:{port}", connect_timeout=2, progress=False)
    assert time.perf_counter() - t0 < 15
    assert f"tcp://127.0.0.1:{port}" in e.value.message and "did not answer" in e.value.message
    assert "dask scheduler" in e.value.hint
    with SweepDB(tmp_path / "ws", readonly=True) as db:  # nothing ran, nothing lost
        assert {c.status for c in db.cells()} == {"pending"}
