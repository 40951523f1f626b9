"""The sweep's precision: each candidate compared with the tolerance of its precision
(workbench.tolerances: fp16 looser than fp32), the tolerance stored in its row and shown in the
report; the ``precision`` axis runs int8 through wb.quantize on ONNX Runtime and ncnn, judged
by its output SNR; and a store of the schema before these columns still opens."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest

import workbench as wb
from workbench.sweeps.cell import CellResult, StageResult, calibration_samples
from workbench.sweeps.db import CellRecord, SweepDB
from workbench.sweeps.matrix import Matrix
from workbench.sweeps.report import render
from workbench.tolerances import INT8_MIN_SNR_DB, for_precision

NETS = textwrap.dedent("""
    def deep():  # fp16 weights move it past the fp32 tolerance, not past fp16's
        import torch
        torch.manual_seed(0)
        layers = []
        for _ in range(6):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers, torch.nn.Linear(64, 8))
        with torch.no_grad():
            for m in net:
                if isinstance(m, torch.nn.Linear):
                    m.weight.normal_(0, 2 / 64 ** 0.5)
        return net.eval(), (torch.randn(1, 64),)

    def outlier():  # one activation 1e4 beside values ~1: per-tensor int8 loses the rest
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.a = torch.nn.Linear(64, 64)
                self.b = torch.nn.Linear(64, 8)
                spike = torch.zeros(64)
                spike[0] = 1e4
                self.register_buffer("spike", spike)

            def forward(self, x):
                return self.b(torch.relu(self.a(x) + self.spike) - self.spike)

        return Net().eval(), (torch.randn(1, 64),)
""")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("precision")
    nets = tmp / "pnets.py"
    nets.write_text(NETS)
    res = wb.sweep([f"{nets}:deep", f"{nets}:outlier"],
                   {"ncnn": ["fp32", "fp16"], "precision": ["int8"], "simplify": ["none"],
                    "raise": [False]}, workspace=tmp / "ws", workers=2, progress=False)
    cells = {(c.name, c.choices["ncnn"]): c for c in res.cells}
    return nets, res, cells


def rows(cell):
    """The cell's rows by stage. A cell whose process died has one row ('model', crashed):
    the assertion then says so, with the cell's error and its log's last lines."""
    out = {s.stage: s for s in cell.stages}
    assert "compare" in out, f"cell {cell.name} {cell.choices}: {why(cell)}"
    return out


def why(cell):
    """Every stage of ``cell`` that is not ok, with its error: what a failure prints (a
    one-off failure is then read from the run that had it, not guessed at)."""
    return "; ".join(f"{s.stage} {s.status}: {s.error_class} {s.error} (hint: {s.hint})"
                     for s in cell.stages if s.status not in ("ok", "off")) or "all ok"


def test_fp16_is_compared_with_the_fp16_tolerance_which_the_fp32_one_would_fail(swept):
    import sys

    nets, _, cells = swept
    fp16, fp32 = rows(cells["deep", "fp16"]), rows(cells["deep", "fp32"])
    assert (fp16["ncnn"].atol, fp16["ncnn"].rtol) == for_precision("fp16") == (1e-2, 1e-2)
    assert (fp32["ncnn"].atol, fp32["ncnn"].rtol) == for_precision("fp32")
    assert (fp16["export"].atol, fp16["export"].rtol) == for_precision("fp32")
    assert fp16["compare"].status == "ok", why(cells["deep", "fp16"])
    assert fp32["compare"].status == "ok", why(cells["deep", "fp32"])
    # the same fp16 model at the fp32 tolerance: not ok, so the looser bar is what passed it
    sys.path.insert(0, str(nets.parent))
    try:
        import pnets
    finally:
        sys.path.remove(str(nets.parent))
    model, inputs = pnets.deep()
    param = next((Path(cells["deep", "fp16"].folder)).glob("*-ncnn/model.ncnn.param"))
    strict = wb.compare(model, [param], inputs, progress=False)
    assert not strict.ok, strict.summary()
    loose = wb.compare(model, [param], inputs, tolerance=for_precision("fp16"), progress=False)
    assert loose.ok, loose.summary()


def test_int8_runs_on_both_backends_and_is_judged_by_its_output_snr(swept):
    _, res, cells = swept
    deep32, deep16 = rows(cells["deep", "fp32"]), rows(cells["deep", "fp16"])
    for row in (deep32["ort-int8"], deep32["ncnn-int8"], deep16["ort-int8"]):
        assert row.status == "ok", row.error
        assert row.snr_db > INT8_MIN_SNR_DB and row.min_snr_db == INT8_MIN_SNR_DB
        assert (row.atol, row.rtol) == for_precision("int8")
        assert row.aligned_fraction > 0.5 and row.artifact.endswith((".onnx", ".param"))
    # ncnn int8 is made from fp32 weights: the fp16 cell has none, and says where it is
    assert deep16["ncnn-int8"].status == "off", why(cells["deep", "fp16"])
    assert "ncnn=fp32" in deep16["ncnn-int8"].hint
    assert {o.candidate for o in cells["deep", "fp32"].ops} == {"export", "ncnn", "ort-int8",
                                                               "ncnn-int8"}
    # the outlier costs ONNX Runtime's per-tensor int8 the signal: a mismatch with its hint
    # (ncnn keeps the add in float and is fine)
    out32 = rows(cells["outlier", "fp32"])
    bad = out32["ort-int8"]
    assert bad.status == "mismatch" and bad.error_class == "snr", why(cells["outlier", "fp32"])
    assert bad.snr_db < INT8_MIN_SNR_DB and "below 10 dB" in bad.error
    assert "exclude=" in bad.hint
    assert out32["ncnn-int8"].status == "ok", why(cells["outlier", "fp32"])
    assert out32["ncnn-int8"].snr_db > INT8_MIN_SNR_DB
    assert cells["outlier", "fp32"].status == "mismatch" and not res.ok
    with SweepDB(res.workspace, readonly=True) as db:
        assert db.integrity() == "ok"


def test_the_report_shows_each_rows_tolerance_and_the_int8_columns_only_when_used(swept):
    _, res, _ = swept
    with SweepDB(res.workspace, readonly=True) as db:
        page = render(db.cells(), db.meta())
    assert "<th>ort-int8</th>" in page and "<th>ncnn-int8</th>" in page
    assert "atol 0.01, rtol 0.01" in page and "atol 0.0001, rtol 0.001" in page
    assert "(&ge; 10)" in page
    with SweepDB(res.workspace, readonly=True) as db:
        plain = db.cells()
    pending = [CellRecord(c.cell_id, c.model, c.name, c.choices, "pending") for c in plain]
    assert "<th>ort-int8</th>" in render(pending, {})  # crossed: shown before any cell ran
    for c in plain:  # as a sweep without int8 stores them: no int8 columns
        c.choices = {k: v for k, v in c.choices.items() if k != "precision"}
        c.stages = [s if s.stage not in ("ort-int8", "ncnn-int8") else
                    StageResult(s.stage, "off") for s in c.stages]
    assert "<th>ort-int8</th>" not in render(plain, {})


def test_calibration_samples_are_the_example_then_seeded_ones_in_its_range():
    import numpy as np
    import torch

    x = torch.rand(1, 3, 8, 8) * 4 - 2
    ids = torch.tensor([[5, 9, 7]])
    a = calibration_samples((x, ids))
    b = calibration_samples((x, ids))
    assert len(a) == 4 and np.array_equal(a[0][0], x.numpy()) and np.array_equal(a[0][1], ids)
    for s, t in zip(a, b, strict=True):  # seeded: the same samples every time
        assert all(np.array_equal(u, v) for u, v in zip(s, t, strict=True))
    for s in a[1:]:
        assert s[0].dtype == np.float32 and s[0].min() >= -2.0001 and s[0].max() <= 2.0001
        assert not np.array_equal(s[0], a[0][0])
        assert s[1].dtype == np.int64 and s[1].min() >= 5 and s[1].max() <= 9


def test_a_store_of_the_earlier_schema_opens_read_only_and_is_upgraded_to_write(tmp_path):
    ws = tmp_path / "old"
    cells = Matrix.of({}).cells(["workbench.zoo:resnet"], ["resnet"])
    with SweepDB(ws) as db:
        db.claim(["workbench.zoo:resnet"], Matrix.of({}).to_json(), cells)
        db.save(CellResult(cells[0].id, [StageResult("model", "ok")]), str(ws))
    with sqlite3.connect(ws / "sweep.db") as c:  # back to schema 1: no tolerance columns
        for col in ("atol", "rtol", "snr_db", "min_snr_db"):
            c.execute(f"ALTER TABLE stages DROP COLUMN {col}")
        c.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    with SweepDB(ws, readonly=True) as db:  # an earlier sweep to diff against
        (cell,) = db.cells()
        assert cell.status == "ok" and cell.stages[0].atol is None
        assert "precision" not in cell.choices
    with SweepDB(ws) as db:  # resumed: the columns are added, nothing lost
        assert db.meta()["schema"] == "3" and db.integrity() == "ok"
        assert db.cells()[0].stages[0].status == "ok"
        db.save(CellResult(cells[0].id, [StageResult("model", "ok", atol=0.5, rtol=0.25)]),
                str(ws))
        assert (db.cells()[0].stages[0].atol, db.cells()[0].stages[0].rtol) == (0.5, 0.25)
    with SweepDB(ws, readonly=True) as db:
        assert json.loads(db.meta()["matrix"]) == Matrix.of({}).axes


def test_token_id_samples_are_given_in_the_width_ncnn_declares(tmp_path):
    """torch hands token ids as int64, the ncnn artifact's graph declares int64 (its runner
    narrows them to ncnn's int32): the cell's samples stay int64 and calibrate."""
    import numpy as np
    import torch

    from workbench.sweeps.cell import as_declared

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 8, 4)).eval()
    ids = (torch.randint(0, 32, (1, 8)),)
    nc = wb.to_ncnn(model, ids, workspace=tmp_path / "ws")
    samples = calibration_samples(ids)
    assert samples[0][0].dtype == np.int64
    fitted = as_declared(samples, nc)
    assert [s[0].dtype for s in fitted] == [np.dtype(np.int64)] * 4
    assert all(np.array_equal(f[0], s[0]) for f, s in zip(fitted, samples, strict=True))
    q = wb.quantize(nc, fitted, backend="ncnn", progress=False)
    assert q.params["precision"] == "int8"


def test_the_diff_names_an_int8_snr_that_moved_while_still_passing():
    """After an upgrade an int8 cell can lose half its signal-to-noise and stay above the
    bar: the diff says so (3 dB or more), and not for a wobble below that."""
    from workbench.sweeps.diff import diff

    def cell(snr: float, status: str = "ok") -> CellRecord:
        return CellRecord("m-1", "a:m", "m", {"precision": "int8"}, status,
                          stages=[StageResult("ort-int8", status, snr_db=snr,
                                              min_snr_db=INT8_MIN_SNR_DB)])

    (fell,) = diff([cell(24.0)], [cell(18.5)]).changes
    assert (fell.stage, fell.kind, fell.before, fell.after) == ("ort-int8", "snr fell",
                                                                "24.0 dB", "18.5 dB")
    assert diff([cell(24.0)], [cell(22.0)]).changes == []
    (broke,) = diff([cell(24.0)], [cell(8.0, "mismatch")]).changes
    assert broke.kind == "broke"
