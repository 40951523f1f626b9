"""wb.ui.sweep_view: the matrix fills in while a sweep runs, and stops watching when done."""

from __future__ import annotations

import threading

from test_sweep import FACTORIES

import workbench as wb


def test_the_view_fills_in_while_the_sweep_runs_and_stops_when_it_is_stored(tmp_path):
    nets = tmp_path / "nets.py"
    nets.write_text(FACTORIES)
    ws = tmp_path / "ws"
    view = wb.ui.sweep_view(ws, interval=0.2)  # before the sweep exists
    assert isinstance(view, wb.ui.SweepView) and "waiting for a sweep" in view.status.value
    seen: list[str] = []
    view.status.observe(lambda change: seen.append(change["new"]), names="value")
    models = [f"{nets}:broken", f"{nets}:flaky"]
    run = threading.Thread(target=wb.sweep, args=(models, {"ncnn": ["fp32", "none"]}),
                           kwargs={"workspace": ws, "workers": 1, "progress": False})
    run.start()
    run.join(timeout=300)
    assert view.wait(timeout=30) and view.finished
    counts = [s for s in seen if "cells stored" in s]
    assert counts[0].startswith("<b>0 of 4</b>") or counts[0].startswith("<b>1 of 4</b>")
    assert counts[-1].startswith("<b>4 of 4</b>") and "4 failed" in counts[-1]
    assert len({c.split("</b>")[0] for c in counts}) >= 3  # it filled in, not only at the end
    assert view.matrix.value.count("data-status='failed'") == 4
    assert view.matrix.value.count("data-status='off'") == 2  # ncnn none: off, not failed
    assert "<img src=x" not in view.matrix.value  # the error in the tooltip stays text
