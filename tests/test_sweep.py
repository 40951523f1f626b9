"""wb.sweep on this machine: the matrix checked, each cell in a fresh process, results in
SQLite, resume, --retry-failed, Ctrl-C, and the bad inputs of issue 19."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import workbench as wb
from workbench import tolerances as wb_tolerances
from workbench.errors import InputError, WorkspaceError
from workbench.sweeps.db import SweepDB, writer_lock
from workbench.sweeps.factory import model_and_inputs, spec_of
from workbench.sweeps.matrix import Matrix

# Factories of the tests' own: torch is imported inside, so a failing factory's cell is quick.
FACTORIES = textwrap.dedent("""
    import os, time

    def tiny():
        import torch
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(4, 2, 1))
        return net.eval(), (torch.rand(1, 3, 8, 8),)

    def broken():
        raise RuntimeError("no weights <img src=x onerror=alert(1)>")

    def flaky():  # fails until a file "fixed" sits beside this one: a bug fixed between sweeps
        if not os.path.exists(os.path.join(os.path.dirname(__file__), "fixed")):
            raise RuntimeError("not fixed yet <img src=x onerror=alert(1)>")
        return tiny()

    def nothing():
        return None

    def bare():
        import torch
        return torch.nn.ReLU()

    def slow():
        time.sleep(120)
        return tiny()

    def threads():  # what the cell's process was given, as its error
        import torch
        raise RuntimeError(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
                           f"torch={torch.get_num_threads()}")

    def segfault():  # a native crash, as a bad kernel in a backend would make
        import signal
        os.kill(os.getpid(), signal.SIGSEGV)

    def kills_its_worker():  # the Dask worker running the cell dies mid-cell, once
        import signal
        marker = os.path.join(os.path.dirname(__file__), "worker-killed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getppid(), signal.SIGKILL)  # the cell's parent: the worker
            os._exit(1)
        raise RuntimeError("second attempt ran")
""")


@pytest.fixture
def nets(tmp_path: Path) -> Path:
    path = tmp_path / "nets.py"
    path.write_text(FACTORIES)
    return path


# -- the matrix and the factories, checked before anything runs ---------------------------------
@pytest.mark.parametrize("matrix, expected", [
    ({"exporters": ["dynamo"]}, "unknown choice 'exporters'"),
    ({"exporter": ["torchscript", "onnxscript"]}, "unknown value 'onnxscript'"),
    ({"opset": [99]}, "is not an opset"),
    ({"ncnn": []}, "is empty"),
    ({"precision": ["int4"]}, "unknown value 'int4'"),
    ({"precision": ["fp16"]}, "not a quantization the sweep runs"),
    (["exporter"], "expected a dict"),
])
def test_a_bad_matrix_is_a_hinted_error_before_any_cell_runs(tmp_path, nets, matrix, expected):
    with pytest.raises(InputError) as e:
        wb.sweep([f"{nets}:tiny"], matrix, workspace=tmp_path / "ws", progress=False)
    assert expected in e.value.message and e.value.hint
    assert not (tmp_path / "ws").exists()  # nothing written for a refused sweep


def test_the_matrix_crosses_every_choice_with_defaults_and_stable_ids():
    m = Matrix.of({"exporter": ["torchscript", "dynamo"], "ncnn": ["fp32", "FP16"],
                   "raise": ["off"], "opset": ["17"]})
    cells = m.cells(["a:f", "b:g"], ["f", "g"])
    assert len(cells) == 2 * 2 * 2
    assert {c.options["ncnn"] for c in cells} == {"fp32", "fp16"}
    assert all(c.options["raise"] is False and c.options["opset"] == 17
               and c.options["simplify"] == "onnxslim" for c in cells)
    assert len({c.id for c in cells}) == len(cells)
    again = Matrix.of({"ncnn": ["fp32", "fp16"], "exporter": ["torchscript", "dynamo"],
                       "raise": False, "opset": 17}).cells(["a:f", "b:g"], ["f", "g"])
    assert [c.id for c in again] == [c.id for c in cells]


def test_precision_left_at_fp32_keeps_the_cells_of_a_sweep_made_before_it_existed():
    """A sweep that does not cross precision has the ids and labels it had before the axis
    (pinned: resnet-ce4e90d49c), so it resumes and diffs against older workspaces."""
    for spec in ({"ncnn": ["fp16"]}, {"ncnn": "fp16", "precision": ["fp32"]}):
        cell = Matrix.of(spec).cells(["workbench.zoo:resnet"], ["resnet"])[0]
        assert cell.id == "resnet-ce4e90d49c" and "precision" not in cell.label
        assert cell.options["precision"] == "fp32"
    crossed = Matrix.of({"precision": ["fp32", "int8-ort", "INT8"]})
    assert crossed.axes["precision"] == ["fp32", "int8-onnxruntime", "int8"]
    cells = crossed.cells(["workbench.zoo:resnet"], ["resnet"])
    assert [c.label.split()[-1] for c in cells] == ["precision=fp32", "precision=int8-onnxruntime",
                                                    "precision=int8"]
    assert cells[0].id != "resnet-ce4e90d49c"  # another sweep: its matrix says so


@pytest.mark.parametrize("factory, expected", [
    ("nothing", "returned None, expected (model, example_inputs)"),
    ("bare", "returned a bare ReLU"),
    ("broken", "broken() raised RuntimeError: no weights"),
    ("missing", "has no callable 'missing'"),
])
def test_a_factory_that_raises_or_returns_no_model_is_a_hinted_error(nets, factory, expected):
    with pytest.raises(InputError) as e:
        model_and_inputs(f"{nets}:{factory}")
    assert expected in e.value.message and e.value.hint


def test_a_callable_becomes_a_spec_a_fresh_process_can_import():
    from workbench import zoo

    assert spec_of(zoo.vit) == "workbench.zoo:vit"
    with pytest.raises(InputError, match="module-level function"):
        spec_of(lambda: None)
    with pytest.raises(InputError, match="expected a factory"):
        spec_of(42)


# -- a sweep, stored, resumed, retried ------------------------------------------------------------
def test_a_sweep_stores_every_stage_resumes_and_retries_failed_cells(tmp_path, nets):
    fixed = nets.parent / "fixed"
    ws = tmp_path / "ws"
    models = [f"{nets}:tiny", f"{nets}:flaky"]
    seen = []
    res = wb.sweep(models, {"exporter": ["torchscript"]}, workspace=ws, workers=2,
                   progress=False, on_cell=seen.append)
    assert res.ran == 2 and res.resumed == 0 and not res.ok and len(seen) == 2
    by = {c.name: c for c in res.cells}
    tiny, flaky = by["tiny"], by["flaky"]
    assert tiny.status == "ok" and flaky.status == "failed"
    stages = {s.stage: s for s in tiny.stages}
    assert list(stages) == ["model", "export", "simplify", "raise", "ncnn", "ort-int8",
                            "ncnn-int8", "compare"]
    assert [s.status for s in stages.values()] == ["ok"] * 5 + ["off"] * 2 + ["ok"]
    assert (stages["ncnn"].atol, stages["ncnn"].rtol) == wb_tolerances.for_precision("fp32")
    assert stages["export"].nodes == 3 and stages["export"].max_abs < 1e-5
    assert stages["ncnn"].aligned_fraction > 0.5 and stages["raise"].aligned_fraction > 0.5
    assert stages["export"].tools["torch"] and stages["ncnn"].tools["ncnn"]
    assert all(s.seconds > 0 for s in stages.values() if s.status != "off")
    assert (Path(tiny.folder) / "0001-export" / "model.onnx").is_file()
    assert {o.candidate for o in tiny.ops} == {"raise", "ncnn"}
    bad = flaky.stages[0]
    assert (bad.stage, bad.error_class) == ("model", "InputError")
    assert "not fixed yet" in bad.error and bad.hint
    assert [s.status for s in flaky.stages[1:]] == ["skipped"] * 4 + ["off"] * 2 + ["skipped"]
    # the same sweep again: every cell was stored, none runs
    again = wb.sweep(models, {"exporter": "torchscript"}, workspace=ws, progress=False)
    assert again.ran == 0 and again.resumed == 2
    assert [c.status for c in again.cells] == ["ok", "failed"]
    # --retry-failed reruns the failed cell only (now fixed), not the finished one
    fixed.write_text("")
    retried = wb.sweep(models, {"exporter": "torchscript"}, workspace=ws, progress=False,
                       retry_failed=True)
    assert retried.ran == 1 and retried.ok
    after = {c.name: c for c in retried.cells}
    assert after["flaky"].attempts == 2 and after["tiny"].attempts == 1
    assert after["tiny"].finished == tiny.finished
    with SweepDB(ws, readonly=True) as db:
        assert db.integrity() == "ok"
    # a workspace of another sweep is refused, not mixed
    with pytest.raises(WorkspaceError) as e:
        wb.sweep([f"{nets}:tiny"], {"exporter": ["dynamo"]}, workspace=ws, progress=False)
    assert "holds another sweep" in e.value.message and "new folder" in e.value.hint


def test_a_native_crash_costs_one_cell_and_is_reported_with_its_signal(tmp_path, nets):
    res = wb.sweep([f"{nets}:segfault", f"{nets}:broken", f"{nets}:nothing"], {},
                   workspace=tmp_path / "ws", workers=2, progress=False)
    by = {c.name: c for c in res.cells}
    crash = by["segfault"].stages[0]
    assert by["segfault"].status == "crashed" and crash.error_class == "BackendCrashed"
    assert "signal SIGSEGV" in crash.error and "cell.log" in crash.hint
    assert by["broken"].status == "failed" and "no weights" in by["broken"].stages[0].error
    # a factory that returns no model: that cell fails with the hint of what to return
    none = by["nothing"].stages[0]
    assert by["nothing"].status == "failed" and "returned None" in none.error
    assert "(model, example_inputs)" in none.hint
    with SweepDB(tmp_path / "ws", readonly=True) as db:
        assert db.integrity() == "ok"


def test_cells_side_by_side_share_the_cores_and_a_serial_cell_has_them_all(tmp_path, nets,
                                                                              monkeypatch):
    """The local pool gives each cell cores / slots threads (what a Dask nanny gives its
    workers), so two cells do not oversubscribe two cores; one cell at a time keeps the
    libraries' defaults."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    pool = wb.sweep([f"{nets}:threads"], {"exporter": ["torchscript", "dynamo"]},
                    workspace=tmp_path / "pool", workers=2, progress=False)
    n = max(1, (os.cpu_count() or 1) // 2)
    assert all(f"OMP_NUM_THREADS={n} torch={n} (at" in c.stages[0].error for c in pool.cells)
    assert len(pool.cells) == 2
    serial = wb.sweep([f"{nets}:threads"], {}, workspace=tmp_path / "serial", workers=1,
                      progress=False)
    assert "OMP_NUM_THREADS=None" in serial.cells[0].stages[0].error


def test_a_folder_with_a_foreign_sweep_db_is_refused(tmp_path, nets):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sweep.db").write_bytes(b"not sqlite at all " * 100)
    with pytest.raises(WorkspaceError) as e:
        wb.sweep([f"{nets}:tiny"], {}, workspace=ws, progress=False)
    assert "is not a sweep database" in e.value.message and "move it aside" in e.value.hint


def test_two_sweeps_on_one_workspace_the_second_is_refused_at_once(tmp_path, nets):
    ws = tmp_path / "ws"
    with writer_lock(ws):  # the lock a running sweep holds (flock: per open file)
        t0 = time.perf_counter()
        with pytest.raises(WorkspaceError) as e:
            wb.sweep([f"{nets}:tiny"], {}, workspace=ws, progress=False)
        assert time.perf_counter() - t0 < 5
    assert "being written by another sweep" in e.value.message
    assert f"pid {os.getpid()}" in e.value.message and "Ctrl-C" in e.value.hint


def test_ctrl_c_stops_the_sweep_keeps_finished_cells_and_another_sweep_waits(tmp_path, nets):
    """`workbench sweep` in a terminal: Ctrl-C while a cell runs exits 130, the finished cell
    stays stored, the database is sound, no cell process is left, and a second sweep on the
    same workspace meanwhile is refused."""
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", f"{nets}:broken", f"{nets}:slow",
           "--workspace", str(ws), "--workers", "1"]
    # SIGINT at its default in the child, as in a terminal (a suite run as a background job
    # inherits SIGINT ignored)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the first cell is stored
            time.sleep(1)
            if (ws / "sweep.db").exists():
                with sqlite3.connect(ws / "sweep.db") as c:
                    if c.execute("SELECT count(*) FROM cells WHERE status != 'pending'"
                                 ).fetchone()[0]:
                        break
        else:
            pytest.fail("no cell finished in 120 s")
        with pytest.raises(WorkspaceError, match="being written by another sweep"):
            wb.sweep([f"{nets}:broken", f"{nets}:slow"], {}, workspace=ws, progress=False)
        for _ in range(60):  # the next cell's folder: made as it starts (a loaded machine)
            slow_dir = next((p for p in (ws / "cells").iterdir() if p.name.startswith("slow")),
                            None)
            if slow_dir is not None and (slow_dir / "cell.json").is_file():
                break
            time.sleep(0.5)
        assert slow_dir is not None, "the second cell did not start in 30 s"
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: 1 of 2 cell(s) stored" in err and "Traceback" not in err
    with SweepDB(ws, readonly=True) as db:
        assert db.integrity() == "ok"
        status = {c.name: c.status for c in db.cells()}
    assert status == {"broken": "failed", "slow": "pending"}
    assert not (slow_dir / "result.json").exists()
    ps = subprocess.run(["pgrep", "-f", str(slow_dir / "cell.json")], capture_output=True)
    assert ps.returncode == 1, "a cell process outlived the sweep"
    assert json.loads((slow_dir / "cell.json").read_text())["name"] == "slow"


def test_a_sweep_killed_outright_leaves_a_sound_store_no_cell_running_and_the_lock_free(
        tmp_path, nets):
    """SIGKILL (no Ctrl-C handler runs): the stored cell stays, the store is sound, the cell
    that was running stops by itself (it watches its parent) and the next sweep can start."""
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", f"{nets}:broken", f"{nets}:slow",
           "--workspace", str(ws), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        running = None
        while time.monotonic() < deadline and running is None:  # the slow cell under way
            time.sleep(1)
            cells = ws / "cells"
            slow = [p for p in cells.iterdir() if p.name.startswith("slow")] \
                if cells.is_dir() else []
            if slow and subprocess.run(["pgrep", "-f", str(slow[0] / "cell.json")],
                                       capture_output=True).returncode == 0:
                running = slow[0]
        assert running is not None, "the slow cell did not start in 120 s"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    t0 = time.monotonic()
    while subprocess.run(["pgrep", "-f", str(running / "cell.json")],
                         capture_output=True).returncode == 0:
        assert time.monotonic() - t0 < 15, "the cell outlived its sweep by 15 s"
        time.sleep(0.5)
    with SweepDB(ws, readonly=True) as db:
        assert db.integrity() == "ok"
        assert {c.name: c.status for c in db.cells()} == {"broken": "failed", "slow": "pending"}
    with writer_lock(ws):  # the dead sweep's lock went with it
        pass
