"""Diagnostics grouped for reading: the user's own problems first, repeats and library
internals one line with a count, site-packages paths shortened (diagnostics.group_diagnostics
and the panels' list)."""

from __future__ import annotations

import inspect
import re

import torch

import workbench as wb
from workbench.diagnostics import Diagnostic, group_diagnostics, short_source
from workbench.ui.panels import artifact_html


class _StridedConstants(torch.nn.Module):
    """Three strided slices of a buffer (torch warns 'Constant folding - Only steps=1' once
    per folding pass) and one int() of a shape (the user's own tracer trap)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.randn(2, 8, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = int(x.shape[1])
        a = self.b[:, ::2] + x[:, ::2]
        c = self.b[:, 1::2] * a
        return c * n, self.b[..., ::3]


def test_real_export_groups_torch_internals_behind_the_users_problem(tmp_path) -> None:
    art = wb.export(_StridedConstants(), torch.randn(2, 8, 6), workspace=tmp_path)
    folding = [d for d in art.diagnostics if d.message.startswith("Constant folding")]
    assert len(folding) >= 2, art.diagnostics  # torch says it more than once
    view = group_diagnostics(art.diagnostics)
    # the user's own trap leads
    assert view.own[0].code == "tracer-constant" and "int(x.shape[1])" in view.own[0].message
    lines, first = inspect.getsourcelines(_StridedConstants.forward)
    site = first + next(i for i, ln in enumerate(lines) if "int(x.shape[1])" in ln)
    assert view.own[0].sources == [f"{__file__}:{site}"]  # the user's own path, whole
    # torch's repeated constant-folding warning is one internal group with its count
    fold = [g for g in view.internal if g.message.startswith("Constant folding")]
    assert len(fold) == 1 and fold[0].count == len(folding)
    assert fold[0].package == "torch"
    assert all(s.startswith("torch/onnx/") for s in fold[0].sources), fold[0].sources
    assert "×" in fold[0].line() and "site-packages" not in fold[0].line()
    # a deprecation raised inside torch's own code is internal too
    assert any(g.code == "deprecation" for g in view.internal)
    assert not any(g.code == "deprecation" for g in view.own)
    assert view.total == len(art.diagnostics)
    # the panel shows the same order, and no long install paths
    html = artifact_html(art)
    assert "site-packages" not in html
    assert html.index("tracer-constant") < html.index("library internals (torch)")
    items = re.findall(r"<li class='wb-diag[^>]*>(.*?)</li>", html)
    assert sum("Only steps=1" in i for i in items) == 1, items


def test_repeats_collapse_and_levels_order_own_problems() -> None:
    pkg = "/opt/py/lib/python3.11/site-packages"
    diags = [
        Diagnostic("info", "legacy-exporter", "the TorchScript exporter is deprecated"),
        Diagnostic("warning", "tracer-constant", "froze: `n = len(x)`", "keep a tensor",
                   "/home/u/model.py:7"),
        Diagnostic("warning", "tracer-constant", "froze: `n = len(x)`", "keep a tensor",
                   "/home/u/model.py:7"),
        Diagnostic("warning", "tracer-constant", "froze: `s = int(h)`", "keep a tensor",
                   f"{pkg}/transformers/models/mobilenet_v2/modeling_mobilenet_v2.py:51"),
        Diagnostic("warning", "tracer-constant", "froze: `s = int(h)`", "keep a tensor",
                   f"{pkg}/transformers/models/mobilenet_v2/modeling_mobilenet_v2.py:51"),
        Diagnostic("error", "check-failed", "outputs differ"),
    ]
    view = group_diagnostics(diags)
    assert [(g.level, g.code, g.count) for g in view.own] == [
        ("error", "check-failed", 1), ("warning", "tracer-constant", 2),
        ("info", "legacy-exporter", 1)]
    assert view.own[1].sources == ["/home/u/model.py:7"]  # the user's path stays whole
    (lib,) = view.internal
    assert lib.count == 2 and lib.package == "transformers"
    assert lib.sources == ["transformers/models/mobilenet_v2/modeling_mobilenet_v2.py:51"]


def test_short_source() -> None:
    assert short_source("/usr/lib/python3/dist-packages/onnx/checker.py:3") == "onnx/checker.py:3"
    assert short_source(r"C:\py\Lib\site-packages\torch\nn\f.py:9") == r"torch\nn\f.py:9"
    assert short_source("/home/u/site_packages_notes/m.py:1") == "/home/u/site_packages_notes/m.py:1"
    assert short_source(None) is None
