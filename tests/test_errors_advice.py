"""Errors read like advice in a notebook: message, hint and the cause's line come first, the
traceback follows (also for %tb); the TransformerEncoderLayer hint names the exporter that
really takes it."""

from __future__ import annotations

import re

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from test_notebooks import python3_kernel  # noqa: F401 - the fixture, used by name below

import workbench as wb
from workbench.errors import ExportError, InputError, WorkbenchError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _encoder_layer() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                         batch_first=True).eval()
    return m, torch.randn(1, 5, 16)


def _raise_chained() -> WorkbenchError:
    try:
        try:
            int("seven")
        except ValueError as inner:
            raise InputError("input 'x' is not a tensor", "pass a torch.Tensor") from inner
    except InputError as e:
        return e
    raise AssertionError("unreachable")


def test_advice_leads_and_traceback_follows() -> None:
    e = _raise_chained()
    assert e.cause_line() == "ValueError: invalid literal for int() with base 10: 'seven'"
    lines = [ANSI.sub("", ln) for ln in e._render_traceback_()]
    assert lines[:3] == ["InputError: input 'x' is not a tensor", "hint: pass a torch.Tensor",
                         "cause: ValueError: invalid literal for int() with base 10: 'seven'"]
    rest = "\n".join(lines[3:])
    assert "Traceback (most recent call last)" in rest and "_raise_chained" in rest
    html = e._repr_html_()
    assert html.index("input &#x27;x&#x27;") < html.index("<details>") < html.index("Traceback")


def test_cause_already_in_message_is_not_repeated() -> None:
    try:
        try:
            raise KeyError("conv1")
        except KeyError as inner:
            raise WorkbenchError("no module 'conv1': KeyError: 'conv1'") from inner
    except WorkbenchError as e:
        assert e.cause_line() == ""
        assert len(e.advice_lines()) == 1


def test_encoder_layer_hint_names_dynamo_and_dynamo_exports_it(tmp_path) -> None:
    m, x = _encoder_layer()
    with pytest.raises(ExportError) as info:
        wb.export(m, x, workspace=tmp_path / "ts")
    assert "is_causal" in info.value.message
    assert "exporter='dynamo'" in info.value.hint
    art = wb.export(m, x, workspace=tmp_path / "dyn", exporter="dynamo")  # the hint holds
    assert art.path.exists()
    assert not [d for d in art.diagnostics if d.level == "error"]


def test_failed_export_in_a_kernel_leads_with_message_and_hint(
        python3_kernel: str, tmp_path) -> None:  # noqa: F811 - the imported fixture
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(
            "import torch, workbench as wb\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()\n"
            "wb.export(m, torch.randn(1, 5, 16), workspace='ws')"),
        nbformat.v4.new_code_cell("%tb"),
    ])
    NotebookClient(nb, kernel_name=python3_kernel, timeout=240, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"no error output in {cell.source!r}: {cell.outputs}"
        text = [ANSI.sub("", s) for s in "\n".join(errors[0].traceback).splitlines()]
        assert text[0].startswith("ExportError: torchscript export failed: TypeError: "
                                  "scaled_dot_product_attention()"), text[:3]
        hint = next(i for i, ln in enumerate(text) if ln.startswith("hint: "))
        assert "exporter='dynamo'" in text[hint]
        # the traceback is still there, below the advice, down to the exporter's frames
        tb = next(i for i, ln in enumerate(text) if "full traceback" in ln)
        assert hint < tb and any("export.py" in ln for ln in text[tb:])


def test_an_op_no_library_registered_is_named_not_blamed_on_the_inputs(tmp_path) -> None:
    """A model calling ``torch.ops.mylib.nothere`` fails in torch before any export: the
    error names the op and says how to declare it, not "give inputs of the shape...";
    the custom-ops panel reads the op from it."""

    class CallsMissing(torch.nn.Module):
        def forward(self, x):
            return torch.ops.wbtest_missing.nothere(x) + 1

    with pytest.raises(wb.MissingOpError) as info:
        wb.export(CallsMissing(), (torch.randn(1, 3),), workspace=tmp_path / "ws")
    assert "torch.ops.wbtest_missing.nothere" in str(info.value)
    assert "@wb.custom_op('wbtest_missing::nothere')" in info.value.hint
    assert "shape" not in info.value.hint
