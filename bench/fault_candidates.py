"""The candidates of one model in ``bench/faults.py``, built once in a temporary workspace.

``export`` (``wb.export``, TorchScript exporter, opset 17), ``simplify`` (``wb.simplify``,
onnxslim), ``raise`` (``wb.raise_ops`` of the simplified model) and ``ncnn``
(``wb.to_ncnn(model)``, fp32 weights; ``to_ncnn(onnx artifact)`` if that raises
ConversionError). Opt-in, ``--kinds dynamo``: ``wb.export(..., exporter="dynamo", opset=18)``,
whose nodes name their modules in metadata, not in value names. A candidate that cannot be
built is a note; its trials are not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fault_records import first_line

KINDS = ("export", "simplify", "raise", "ncnn")
# opt-in (--kinds dynamo): the torch.export-based exporter, whose nodes carry their modules in
# metadata rather than in value names: another path through alignment
EXTRA_KINDS = ("dynamo",)


def build_candidates(name: str, model: Any, x: tuple, ws: Any, kinds: list[str],
                     notes: list[str], export_options: dict[str, Any] | None = None
                     ) -> dict[str, Path]:
    import workbench as wb

    out: dict[str, Path] = {}
    onx = sim = None
    opts = export_options or {}
    try:
        if {"export", "simplify", "raise", "ncnn"} & set(kinds):
            onx = wb.export(model, x, workspace=ws, exporter="torchscript", opset=17, **opts)
            out["export"] = Path(onx.path)
        if {"simplify", "raise"} & set(kinds):
            sim = wb.simplify(onx, workspace=ws)
            out["simplify"] = Path(sim.path)
        if "raise" in kinds:
            out["raise"] = Path(wb.raise_ops(sim, workspace=ws).path)
    except Exception as e:
        notes.append(f"{name}: ONNX stages failed: {type(e).__name__}: {first_line(e)}")
    if "dynamo" in kinds:
        try:
            out["dynamo"] = Path(wb.export(model, x, workspace=ws, exporter="dynamo",
                                           opset=18, **opts).path)
        except Exception as e:
            notes.append(f"{name}: dynamo export failed: {type(e).__name__}: {first_line(e)}")
    if "ncnn" in kinds:
        try:
            out["ncnn"] = Path(wb.to_ncnn(model, x, workspace=ws).path)
        except wb.ConversionError as e:
            first = first_line(e)
            try:
                if onx is None:
                    raise
                out["ncnn"] = Path(wb.to_ncnn(onx, workspace=ws).path)
                notes.append(f"{name}: ncnn via to_ncnn(onnx artifact); to_ncnn(module): {first}")
            except Exception as e2:
                notes.append(f"{name}: to_ncnn failed: {type(e2).__name__}: {first_line(e2)} "
                             f"(to_ncnn(module): {first})")
        except Exception as e:
            notes.append(f"{name}: to_ncnn failed: {type(e).__name__}: {first_line(e)}")
    return {k: v for k, v in out.items() if k in kinds}

