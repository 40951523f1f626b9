"""The sweep's ARM axis: ``{"target": [None, "arm64-v8.2"]}`` runs a cell's ncnn candidates in
ncnn's own aarch64 build under QEMU user mode (started by the process that runs the cell, on
this machine or on a Dask worker), the ``ncnn`` value then being the precision ncnn runs
there; each ncnn row records where it ran, the flags that ran and its output check there. An
axis left at None keeps the cells (ids, labels) of sweeps made before it; unknown targets and a
missing ARM environment are hinted errors before any cell runs. Tiny models: each emulated
worker costs seconds to start."""

from __future__ import annotations

import json
import math
import sqlite3
import textwrap

import pytest

import workbench as wb
from workbench.errors import InputError
from workbench.sweeps.cell import CellResult, StageResult
from workbench.sweeps.db import SweepDB
from workbench.sweeps.matrix import Matrix, run_precision
from workbench.sweeps.report import render

NETS = textwrap.dedent("""
    def probe():  # exactly the bias, 1, while fp16 partial sums pass 65504 on ARMv8.2
        import torch
        fc = torch.nn.Linear(64, 1)
        with torch.no_grad():
            w = torch.full((1, 64), 250.0)
            w[0, 1::2] = -250.0
            fc.weight.copy_(w)
            fc.bias.fill_(1.0)
        return torch.nn.Sequential(fc).eval(), (torch.full((64,), 250.0),)

    def tiny():
        import torch
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(4, 2, 1))
        return net.eval(), (torch.rand(1, 3, 8, 8),)
""")
# the cells' own stages, kept small: the ARM axis is about the ncnn candidates
LEAN = {"simplify": ["none"], "raise": [False]}


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep-arm") / "armnets.py"
    path.write_text(NETS)
    return path


def rows(cell):
    out = {s.stage: s for s in cell.stages}
    assert "compare" in out, f"cell {cell.label}: {cell.stages}"
    return out


def test_the_target_axis_is_checked_and_left_at_none_keeps_the_older_cells():
    for spec in ({"ncnn": ["fp16"]}, {"ncnn": "fp16", "target": [None]},
                 {"ncnn": "fp16", "target": "none"}):
        cell = Matrix.of(spec).cells(["workbench.zoo:resnet"], ["resnet"])[0]
        # pinned in test_sweep: the id a sweep had before the precision and target axes
        assert cell.id == "resnet-ce4e90d49c" and "target" not in cell.label
        assert cell.options["target"] is None
    crossed = Matrix.of({"target": [None, "host", "arm64-v8.2", "arm64-v8.0"]})
    assert crossed.axes["target"] == [None, "arm64-v8.2", "arm64-v8.0"]
    cells = crossed.cells(["workbench.zoo:resnet"], ["resnet"])
    assert [c.label.split()[-1] for c in cells] == ["target=host", "target=arm64-v8.2",
                                                    "target=arm64-v8.0"]
    assert json.loads(crossed.to_json())["target"] == [None, "arm64-v8.2", "arm64-v8.0"]
    for bad in ("arm64-v9", 8.2):
        with pytest.raises(InputError) as e:
            Matrix.of({"target": [None, bad]})
        assert "unknown ARM target" in e.value.message and "arm64-v8.2" in e.value.message
        assert "'target': [None, 'arm64-v8.2']" in e.value.hint and "ARMv8.2 phone" in \
            e.value.hint
    assert Matrix.of({"ncnn": ["fp16-storage"]}).axes["ncnn"] == ["fp16-storage"]
    # what ncnn runs: on a target the ncnn value; here fp32 but for fp16-storage
    assert [run_precision(v, "arm64-v8.2") for v in ("fp32", "fp16", "fp16-storage")] == \
        ["fp32", "fp16", "fp16-storage"]
    assert [run_precision(v, None) for v in ("fp32", "fp16", "fp16-storage")] == \
        ["fp32", "fp32", "fp16-storage"]


def test_a_missing_arm_environment_is_one_hinted_error_before_any_cell(nets, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("WORKBENCH_ARM64", str(tmp_path / "nothing"))
    with pytest.raises(InputError) as e:
        wb.sweep([f"{nets}:tiny"], {"target": [None, "arm64-v8.2"]},
                 workspace=tmp_path / "ws", progress=False)
    assert "make arm-target" in e.value.hint
    assert not (tmp_path / "ws").exists()
    # the CLI: exit 2 with the hint
    from workbench.cli import main

    assert main(["sweep", f"{nets}:tiny", "--target", "none,arm64-v9", "--workspace",
                 str(tmp_path / "ws")]) == 2


def test_a_cell_on_an_arm_target_runs_ncnn_there_and_records_what_ran(nets, tmp_path):
    res = wb.sweep([f"{nets}:probe"], {"target": [None, "arm64-v8.2"], "ncnn": ["fp16"],
                                       **LEAN}, workspace=tmp_path / "ws", workers=1,
                   progress=False)
    host, arm = res.cells
    assert (host.choices["target"], arm.choices["target"]) == (None, "arm64-v8.2")
    h, a = rows(host), rows(arm)
    # this machine: fp16 weights read into fp32, as the sweep always compared them
    assert host.status == "ok" and (h["ncnn"].target, h["ncnn"].flags) == ("", "fp32")
    assert h["ncnn"].target_max_abs is None
    # ARMv8.2: fp16 arithmetic, whose accumulation overflows: the row says what ran where
    assert (a["ncnn"].target, a["ncnn"].flags) == ("arm64-v8.2", "fp16 arithmetic")
    assert math.isinf(a["ncnn"].target_max_abs)
    assert a["ncnn"].status == "mismatch" and a["ncnn"].error_class == "target"
    assert "fp16 (ran as fp16 arithmetic)" in a["ncnn"].error
    assert "fp16_unsafe" in a["ncnn"].hint
    assert a["ncnn"].max_abs == h["ncnn"].max_abs  # the conversion's own check, on x86
    assert a["ncnn"].first_divergence.startswith("0 (InnerProduct")
    assert a["compare"].status == "mismatch" and "arm64-v8.2" in a["compare"].error
    assert arm.status == "mismatch" and not res.ok
    # the report shows where each ncnn candidate ran and its error there
    with SweepDB(tmp_path / "ws", readonly=True) as db:
        html = render(db.cells(), db.meta())
    assert "max abs on target" in html and "fp16 arithmetic on arm64-v8.2" in html
    assert "fp32 here" in html


def test_an_arm_cell_runs_on_a_dask_worker(nets, tmp_path):
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        res = wb.sweep([f"{nets}:tiny"], {"target": ["arm64-v8.2"], "ncnn": ["fp32"],
                                          **LEAN}, workspace=tmp_path / "ws", client=client,
                       progress=False)
        workers = set(client.scheduler_info()["workers"])
    (cell,) = res.cells
    assert res.where.startswith("dask tcp://") and cell.worker in workers
    r = rows(cell)
    assert cell.status == "ok", [(s.stage, s.status, s.error) for s in cell.stages]
    assert (r["ncnn"].target, r["ncnn"].flags) == ("arm64-v8.2", "fp32")
    assert r["ncnn"].target_max_abs < 1e-4 and r["ncnn"].aligned_fraction == 1.0


def test_a_store_of_schema_2_gains_the_target_columns(tmp_path):
    ws = tmp_path / "old"
    cells = Matrix.of({}).cells(["workbench.zoo:resnet"], ["resnet"])
    with SweepDB(ws) as db:
        db.claim(["workbench.zoo:resnet"], Matrix.of({}).to_json(), cells)
        db.save(CellResult(cells[0].id, [StageResult("ncnn", "ok")]), str(ws))
    with sqlite3.connect(ws / "sweep.db") as c:  # back to schema 2: no target columns
        for col in ("target", "flags", "target_max_abs"):
            c.execute(f"ALTER TABLE stages DROP COLUMN {col}")
        c.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    with SweepDB(ws, readonly=True) as db:
        (stage,) = db.cells()[0].stages
        assert (stage.target, stage.flags, stage.target_max_abs) == ("", "", None)
    with SweepDB(ws) as db:
        assert db.meta()["schema"] == "3"
        db.save(CellResult(cells[0].id, [StageResult("ncnn", "ok", target="arm64-v8.2",
                                                     flags="fp16 arithmetic",
                                                     target_max_abs=0.5)]), str(ws))
        (stage,) = db.cells()[0].stages
        assert (stage.target, stage.flags, stage.target_max_abs) == (
            "arm64-v8.2", "fp16 arithmetic", 0.5)
