"""The compare view's noise-floor column: beside the error for an fp32 candidate, blank for a
low precision's rows (issue 36 item 1: show the noise floor beside the error in the table)."""

from __future__ import annotations

import html
import re

import pytest
import torch

import workbench as wb


@pytest.fixture(scope="module")
def fp32_and_fp16(tmp_path_factory):
    """The default model compared with its ONNX export (fp32: judged by its noise floor) and
    its ncnn model run in fp16 (a low precision: its own per-element rule, no floor)."""
    from workbench.runtime import NcnnRunner

    torch.manual_seed(0)
    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path_factory.mktemp("cv-floor") / "ws")
    onx = wb.export(model, x, workspace=ws)
    nc = wb.to_ncnn(model, x, workspace=ws)
    return wb.compare(model, [onx, NcnnRunner(nc, precision="fp16", num_threads=1)], x,
                      progress=False)


def _table(view):
    """(header names, [(row's candidate, {column: (cell text, cell tag)})]) of the table."""
    html = view.table_w.html
    head = [re.sub(r" [\u25b2\u25bc]$", "", h)
            for h in re.findall(r"<th[^>]*>([^<]*)</th>", html)]
    rows = []
    for tr in re.findall(r"<tr class=[^>]*>(.*?)</tr>", html):
        cells = re.findall(r"(<td[^>]*>)(.*?)</td>", tr)
        by = {c: (text, tag) for c, (tag, text) in zip(head, cells, strict=True)}
        rows.append((by["candidate"][0], by))
    return head, rows


def test_the_noise_floor_sits_beside_the_error_and_is_blank_without_one(fp32_and_fp16):
    from workbench.ui.compareview import FLOOR_BASIS, CompareView

    rep = fp32_and_fp16
    fp32, fp16 = (c.name for c in rep.candidates)
    assert rep.candidates[1].precision == "fp16"
    view = CompareView(rep, figures=False, summary=False)
    head, rows = _table(view)
    assert head[head.index("max_abs") + 1] == "noise_floor"  # beside the error
    floors = {r.name: r.metrics for r in rep.records if r.candidate == fp32}
    assert floors and all(m.floor_basis for m in floors.values())
    seen = {fp32: 0, fp16: 0}
    for cand, cells in rows:
        text, tag = cells["noise_floor"]
        seen[cand] += 1
        if cand == fp16:  # a low precision has no floor: blank, not 0
            assert text == "" and "title" not in tag
            continue
        m = floors[html.unescape(cells["name"][0])]
        assert float(text) == pytest.approx(m.noise_floor, rel=1e-3)  # shown as "%.4g"
        assert m.noise_floor > 0
        assert f'title="fp32 noise floor: {FLOOR_BASIS[m.floor_basis]}"' in html.unescape(tag)
    assert seen[fp32] and seen[fp16]  # both candidates' rows are in the table
    # the view's rows say None where there is no floor; the report's own rows are unchanged
    assert all((r["noise_floor"] is None) == (r["candidate"] == fp16) for r in view.all_rows)
    assert {r["noise_floor"] for r in rep.rows(candidate=fp16)} == {0.0}


def test_sorting_by_noise_floor_puts_the_largest_first_and_blanks_last(fp32_and_fp16):
    from workbench.ui.compareview import CompareView

    rep = fp32_and_fp16
    view = CompareView(rep, figures=False, summary=False)
    view.table_w.clicked = "noise_floor|1"  # a header click: worst (largest) first
    got = [r["noise_floor"] for r in view.rows]
    shown = [f for f in got if f is not None]
    assert shown == sorted(shown, reverse=True) and len(shown) < len(got)
    assert all(f is None for f in got[len(shown):])  # the rows without a floor, last
    view.table_w.clicked = "noise_floor|2"  # again: smallest first, blanks still last
    got = [r["noise_floor"] for r in view.rows]
    assert got[:len(shown)] == sorted(shown) and all(f is None for f in got[len(shown):])
    assert view.sort("noise_floor", descending=True)[0]["noise_floor"] == max(shown)
