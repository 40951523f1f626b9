"""Why a converted ncnn model's outputs differ from torch's: the hints of the output check.

Each reads what the conversion left (pnnx's graph, a run's blobs) and names a cause when the
pattern is there; '' otherwise, so the next hint (or the generic one) is given:

- an RNN whose final hidden state the model reads (``h_n[-1]``), where ncnn's layer gives
  the output sequence (``rnn_hidden_state``);
- a BinaryOp pow over negative bases (``negative_pows``, runtime/ncnn_pow.py);
- outputs of another size or rank (``shape_hint``).

And the hint of the conversion's refusal when the ncnn param holds layers ncnn cannot load
(``unloadable_hint``): a ``torch.tile`` layer (what pnnx keeps of ``torch.tile``,
``Tensor.tile`` and the ONNX ``Tile`` that ``Tensor.repeat`` exports to) points at the shipped
rewriters that remove it, and says how to apply them on the route the model came by (checked
with pnnx 20261020: each route below converts once they apply).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from ..params import PnnxOp, parse_pnnx_param
from ..runtime.ncnn_pow import negative_pows as found_in
from ..runtime.ncnn_pow import note
from ..runtime.ncnn_runner import NcnnRunner

_TILE = "torch.tile"
_TILE_REWRITERS = ("workbench.tile", "workbench.tensor_tile", "workbench.repeat")
_RNNS = {"nn.LSTM": "LSTM", "nn.GRU": "GRU", "nn.RNN": "RNN"}


def pnnx_param_of(ncnn_param: Path) -> Path:
    """The .pnnx.param pnnx wrote beside ``ncnn_param`` (same stem)."""
    return ncnn_param.with_name(ncnn_param.name.removesuffix(".ncnn.param") + ".pnnx.param")


def rnn_hidden_state(pnnx_param: Path) -> str:
    """The hint when pnnx kept an RNN op (nn.LSTM, nn.GRU, nn.RNN) with one output, its final
    hidden state h_n (what the model reads: ``self.fc(h_n[-1])``), but the ncnn layer it
    became puts the output sequence on that blob: what reads h_n reads every step instead.
    Found from the shapes pnnx noted: the op's first output has h_n's shape (layers x
    directions, batch, hidden) and not the sequence's. '' when no such op."""
    try:
        graph = parse_pnnx_param(pnnx_param)
    except (WorkbenchError, OSError):
        return ""
    for op in graph.ops:
        if op.type not in _RNNS or not op.inputs or not op.outputs:
            continue
        shapes = _rnn_shapes(op, graph.operands[op.inputs[0]].shape)
        got = graph.operands[op.outputs[0]].shape
        if shapes is not None and got == shapes[1] != shapes[0]:
            return _rnn_note(op, shapes[0], got)
    return ""


def _rnn_shapes(op: PnnxOp, x: tuple | None) -> tuple[tuple, tuple] | None:
    """(the output sequence's shape, h_n's shape) of an RNN op on input shape ``x``."""
    p = op.params
    try:
        hidden = int(p.get("proj_size", "0")) or int(p["hidden_size"])
        layers = int(p.get("num_layers", "1"))
    except (KeyError, ValueError):
        return None
    d = 2 if p.get("bidirectional") == "True" else 1
    if x is None or len(x) not in (2, 3):
        return None
    if len(x) == 2:  # unbatched: (T, features)
        return (x[0], d * hidden), (d * layers, hidden)
    first = p.get("batch_first") == "True"
    steps, batch = (x[1], x[0]) if first else (x[0], x[1])
    seq = (batch, steps, d * hidden) if first else (steps, batch, d * hidden)
    return seq, (d * layers, batch, hidden)


def _rnn_note(op: PnnxOp, seq: tuple, h_n: tuple) -> str:
    kind = _RNNS[op.type]
    first = op.params.get("batch_first") == "True" and len(seq) == 3
    steps, last = (seq[1], "out[:, -1]") if first else (seq[0], "out[-1]")
    state = "out, (h_n, c_n)" if kind == "LSTM" else "out, h_n"
    notes = []
    if op.params.get("bidirectional") == "True":
        notes.append(f"bidirectional: h_n[-2] is {last}[..., :H] and h_n[-1] is "
                     f"{last.replace('-1', '0')}[..., H:]")
    if op.params.get("num_layers", "1") != "1":
        notes.append(f"h_n of a lower layer is not in out: run that layer as its own nn.{kind}")
    return (f"pnnx wrote {op.type} {op.name!r} with one output, its final hidden state h_n "
            f"{list(h_n)} (what the model reads), but ncnn's {kind} layer puts its output "
            f"sequence on that blob ({steps} steps of {seq[-1]} features): what reads h_n "
            f"reads the sequence instead (a head on it runs on each of the {steps} steps). Read "
            f"the last step of the output sequence, which equals h_n[-1] for a "
            f"single-direction {kind}: {state} = self.{op.name}(x); h = {last}"
            + "".join(f" ({n})" for n in notes) + "; then convert again")


def capture_blobs(param: Path, args: tuple) -> tuple[dict[str, Any], Any]:
    """(every blob of an fp32 run on ``args``, the parsed graph), for the hints; ({}, None)
    when the run fails (a hint only: the generic one is given instead)."""
    try:
        runner = NcnnRunner(param, isolated=True)
        return runner.run(args, capture="all"), runner.graph
    except Exception:  # noqa: BLE001
        return {}, None


def negative_pows(blobs: dict[str, Any], graph: Any) -> str:
    """The hint when a pow layer met negative bases (runtime/ncnn_pow.py); '' when none."""
    if graph is None:
        return ""
    found = found_in(graph, blobs)
    return note(found) if found else ""


def shape_hint(reference: list, got: list) -> str:
    """Why ncnn's outputs have other shapes than torch's: another rank is a batch or layout
    axis handled differently; the same rank with one size off is a size pnnx computed
    differently (a slice end or a view written as an expression of the input's size)."""
    import numpy as np

    pairs = [(np.shape(r), np.shape(g)) for r, g in zip(reference, got, strict=False)
             if np.shape(r) != np.shape(g)]
    if pairs and all(len(a) == len(b) for a, b in pairs):
        axes = sorted({k for a, b in pairs for k, (x, y) in enumerate(zip(a, b, strict=True))
                       if x != y})
        return (f"same rank, other size on axis {', '.join(map(str, axes))}: pnnx evaluated "
                "a size (a slice end, a view or reshape computed from the input's shape) "
                "differently from torch; pnnx's own converted model does the same. Write "
                "that size as a constant, or slice with explicit bounds, and convert again")
    return ("a batch or layout axis was handled differently (another rank); see the "
            "_ncnn.py pnnx wrote for how each output is read")


def unloadable_hint(pnnx_param: Path, bad: list[tuple[str, str]], pnnx_art: Any) -> str:
    """The hint for layers ncnn cannot load, by cause: an RNN's hidden state
    (``rnn_hidden_state``), a ``torch.tile`` (``tile_hint``); '' when neither is the cause."""
    return rnn_hidden_state(pnnx_param) or tile_hint(bad, pnnx_art)


def tile_hint(bad: list[tuple[str, str]], pnnx_art: Any) -> str:
    """How to apply the shipped rewriters that write ``torch.tile`` with ops ncnn has, on the
    route ``pnnx_art`` came by: a module traced by ``to_ncnn`` (``rewrite=True`` applies
    them), an ONNX export for another backend (export for ncnn), an export for ncnn that
    applied none (``rewrite=False`` or unregistered), or an ONNX file the workbench did not
    export. '' when no ``torch.tile`` layer is among ``bad``."""
    if not any(kind == _TILE for kind, _ in bad):
        return ""
    from .rewriters import registered

    if {r.name for a in pnnx_art.lineage() for r in a.rewrites} & set(_TILE_REWRITERS):
        return ""  # they applied: this Tile comes from something else
    gone = [n for n in _TILE_REWRITERS if n not in {r.name for r in registered()}]
    enable = "".join(f"wb.enable_rewriter({n!r}); " for n in gone)
    export = next((a for a in pnnx_art.lineage() if a.stage == "export"), None)
    if pnnx_art.params.get("source") == "torchscript":
        how = (f"they apply while to_ncnn traces the module: {enable}wb.to_ncnn(model, inputs)"
               " (rewrite=True, the default)")
    elif export is None:
        how = ("this ONNX model was not exported here, so nothing can rewrite it: from the "
               f"torch model, {enable}wb.to_ncnn(model, inputs), or "
               "wb.to_ncnn(wb.export(model, inputs, backend='ncnn'))")
    elif export.params.get("backend") != "ncnn":
        how = (f"{export.id} was exported for {export.params.get('backend')!r}, and they "
               f"apply only when exporting for ncnn: {enable}onx = wb.export(model, inputs, "
               "backend='ncnn'); wb.to_ncnn(onx) (or wb.to_ncnn(model, inputs))")
    else:
        how = (f"{export.id} was exported for ncnn but none of them fired (rewrite=False, or "
               f"unregistered): {enable}wb.export(model, inputs, backend='ncnn') "
               "(rewrite=True, the default), then wb.to_ncnn")
    others = sorted({kind for kind, _ in bad if kind != _TILE})
    return ("ncnn has no torch.tile layer (pnnx keeps torch.tile, Tensor.tile and the ONNX "
            "Tile that Tensor.repeat exports to as torch.tile); the shipped rewriters "
            "workbench.tile / workbench.tensor_tile (torch.tile, Tensor.tile) and "
            "workbench.repeat (Tensor.repeat) write it as unsqueeze + expand + flatten, which "
            f"ncnn runs: {how}"
            + (f". The other layer(s) ({', '.join(others)}): rewrite them with supported ops "
               "or register a custom ncnn layer (wb.custom_op)" if others else ""))
