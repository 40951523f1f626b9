"""What pnnx converts, and the reference its conversion is checked against.

A module is traced to TorchScript (``model.pt``), refusing what the trace cannot take and
naming the calls pnnx crashes on (a submodule whose result forward() never uses); torch's
outputs on the example inputs are the reference. An ONNX artifact (or path) is copied with
its external data (``model.onnx``); its reference is the torch outputs stored at export, or
ONNX Runtime's on the inputs given.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import reference_data
from ..diagnostics import Diagnostic
from ..errors import ConversionError, InputError, WorkbenchError
from ..graph import remember_summary
from ..inputs import as_tensor_tuple, run_torch
from ..onnx_io import check_external_location
from ..onnx_weights import rename_location
from ..runtime.onnx_wire import external_files, structure
from ..runtime.ort_runner import OrtRunner
from .export_errors import warning_diagnostics
from .pnnx_preflight import check_onnx_graph
from .simplify import as_onnx_artifact


@dataclass
class PnnxSource:
    """A model to convert: a module to trace (``kind`` "torchscript") or an ONNX artifact
    (``kind`` "onnx"), its example inputs and the workspace the conversion writes to."""

    kind: str
    args: tuple
    workspace: Workspace
    model: Any = None  # the module, for "torchscript"
    parent: Artifact | None = None  # the ONNX artifact, for "onnx"
    stored: tuple | None = None  # (inputs, torch outputs) stored at export, when used


def resolve_source(source: Any, inputs: Any, workspace: Workspace | str | None) -> PnnxSource:
    """``source`` (an ``nn.Module``, an ONNX Artifact or a path) with its example inputs:
    those given, or for an ONNX model those stored at export.

    Raises:
        InputError: a module without inputs; an ONNX model with neither inputs nor a stored
            example; an ONNX graph with no nodes (nothing to convert: pnnx segfaults).
    """
    import torch

    if isinstance(source, torch.nn.Module):
        if inputs is None:
            raise InputError("to_ncnn(module) needs example inputs to trace the module",
                             "wb.to_ncnn(model, (x,))")
        args = as_tensor_tuple(inputs)
        return PnnxSource("torchscript", args, as_workspace(workspace), model=source)
    parent = as_onnx_artifact(source, workspace, "to_ncnn")
    ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
    stored = None
    if inputs is None:
        stored = reference_data(parent)
        if stored is None:
            raise InputError(f"to_ncnn({parent.path.name}) needs example inputs: the ONNX "
                             "file carries no stored example", "wb.to_ncnn(path, (x,))")
        inputs = tuple(torch.from_numpy(v) for v in stored[0].values())
    args = as_tensor_tuple(inputs)
    summary_without_weights(parent.path)
    check_onnx_graph(parent)  # no nodes: nothing to convert (pnnx segfaults)
    return PnnxSource("onnx", args, ws, parent=parent, stored=stored)


def summary_without_weights(path: Path) -> None:
    """The GraphSummary of the .onnx at ``path`` (the artifact's ``graph``: its nodes,
    inputs, outputs, opsets and weights' sizes, read by the checks before pnnx runs) made
    from its graph without the weights' bytes (onnx_wire.structure: a few MB walked, not a
    1.3 GB decoder parsed whole and held while pnnx runs beside it); a file the wire walk
    cannot read is left to ``summarize``, which names what is wrong with it."""
    try:
        remember_summary(path, structure(path))
    except (OSError, ValueError):
        pass


def write_model_file(src: PnnxSource, folder: Path
                     ) -> tuple[Path, list | None, list[Diagnostic]]:
    """The file pnnx converts, written into ``folder``; the reference outputs (None when
    ONNX Runtime cannot run the inputs: pnnx will say more); the trace's diagnostics."""
    if src.kind == "torchscript":
        model_file = folder / "model.pt"
        diags = trace_module(src.model, src.args, model_file)
        return model_file, run_torch(src.model, src.args, "example inputs"), diags
    parent = src.parent
    assert parent is not None
    model_file = folder / "model.onnx"
    _stage_model(parent.path, model_file)
    # the torch outputs stored at export, or ONNX Runtime's on inputs given here
    return model_file, src.stored[1] if src.stored else _ort_outputs(parent, src.args), []


def _stage_model(path: Path, model_file: Path) -> None:
    """The model at ``path`` and the files its weights are in, linked into ``model_file``'s
    folder for pnnx. pnnx (20261020) reads external data right only from ``model.onnx.data``
    beside ``model.onnx`` (measured: an import's ``net.onnx.data`` or ``weights.bin``, linked
    under its own name, converted to NaN or garbage; without the file pnnx segfaults): one
    weights file of another name is linked as ``model.onnx.data`` and the graph (a few MB,
    runtime/onnx_wire.py) written naming it. Several files are linked as they are."""
    import onnx

    model = structure(path)
    files = _weight_files(path, model)
    data = model_file.name + ".data"
    inline = path.name in external_files(model)  # weights inside the .onnx (onnx_wire)
    if len(files) == 1 and files[0] != data and not inline:
        renamed = onnx.ModelProto()
        renamed.CopyFrom(model)
        rename_location(renamed, files[0], data)
        model_file.write_bytes(renamed.SerializeToString())
        link_or_copy(path.parent / files[0], model_file.parent / data)
        return
    link_or_copy(path, model_file)
    for rel in files:
        (model_file.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(path.parent / rel, model_file.parent / rel)


def _weight_files(path: Path, model: Any) -> list[str]:
    """The files (relative to ``path``'s folder, each checked to stay inside it) the model
    at ``path`` reads its weights from, read from its ``structure`` (runtime/onnx_wire.py:
    the weights inline in the .onnx are not read, nor counted)."""
    locations = external_files(model) - {path.name}
    return [check_external_location(path, rel) for rel in sorted(locations)]


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (no 1.3 GB copy of a decoder's weights: pnnx only
    reads it, and whatever rewrites it here replaces the file, never writes into it), or a
    copy where a link cannot be made (another file system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def trace_module(model: Any, args: tuple, out: Path) -> list[Diagnostic]:
    """Trace ``model`` on ``args`` to TorchScript at ``out``; the warnings the trace gave,
    and ``unused-module-output`` when forward() drops a submodule's result.

    Raises:
        ConversionError: torch.jit.trace failed (pnnx converts traced TorchScript).
    """
    import torch

    model.eval()
    with capture() as cap:
        try:
            traced = torch.jit.trace(model, args, check_trace=False)
            traced.save(str(out))
            error = None
        except Exception as e:
            error = e
    if error is None:
        dead = _dead_module_calls(traced)
        if dead:
            return warning_diagnostics(cap) + [Diagnostic(
                "warning", "unused-module-output",
                f"forward() calls {', '.join(dead)} but never uses the result; pnnx crashes "
                "on such calls (SIGSEGV in pass_level1)",
                "drop the call or use its output, or convert the ONNX export instead: "
                "wb.to_ncnn(wb.export(model, inputs))")]
    if error is not None:
        raise ConversionError(f"torch.jit.trace failed before pnnx could run: "
                              f"{type(error).__name__}: {str(error).splitlines()[0]}",
                              "pnnx converts traced TorchScript; make forward() traceable, or "
                              "export to ONNX first and pass the ONNX artifact") from error
    return warning_diagnostics(cap)


def _dead_module_calls(traced: Any) -> list[str]:
    """Submodules whose forward() result the traced graph never uses (pnnx crashes on them)."""
    dead = []
    for node in traced.graph.nodes():
        if node.kind() == "prim::CallMethod" and not any(o.uses() for o in node.outputs()):
            owner = node.inputsAt(0).node()
            name = owner.s("name") if owner.kind() == "prim::GetAttr" else "a submodule"
            dead.append(f"self.{name}")
    return dead


def _ort_outputs(parent: Artifact, args: tuple) -> list | None:
    try:
        return list(OrtRunner(parent).run(args).values())
    except WorkbenchError:  # inputs the ONNX model does not take: pnnx will say more
        return None
