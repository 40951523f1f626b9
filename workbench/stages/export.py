"""Export stage: torch.nn.Module -> ONNX, with the tracing traps caught and explained.

After export: onnx.checker, the IR version lowered for the installed onnxruntime, a numeric
check against torch, each declared dynamic axis tried at a second size, and (when given) a
second set of example inputs to catch branches and loops the trace froze.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..capacity import check_fits, module_bytes
from ..checks import save_reference
from ..customops import translation_table
from ..customops.registry import EXPORTERS, check_opset
from ..diagnostics import Diagnostic
from ..errors import InputError
from ..fileio import atomic_write_bytes
from ..graph import remember_summary, summarize_onnx
from ..inputs import as_tensor_tuple, copies, run_torch, torch_threads
from ..onnx_io import external_locations, load_onnx, lower_ir_version, mark_readable
from ..onnx_weights import (
    EXTERNAL_AT,
    checker_problem,
    rename_location,
    save_with_external_data,
)
from ..progress import Progress, Steps
from ..runtime.heap import heap_held
from ..runtime.onnx_wire import wire_graph
from ..runtime.ort_runner import WARM as ORT_WARM
from ..runtime.worker import warm
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL
from .export_args import check_arity, io_names, normalize_dynamic_axes
from .export_checks import numeric_checks
from .export_errors import export_error, warning_diagnostics
from .moduleop import hooks_restored, moduleop_diagnostics, resolve_moduleops
from .rewrite_session import choose, outputs_watched, verify
from .rewriters import BACKENDS, RewriteContext
from .torchscript_gaps import cast_bool_cumsum

# weights past it go to model.onnx.data (onnx_weights.EXTERNAL_AT says why; protobuf itself
# cannot hold past 2 GB, where torch writes external data of its own)
EXTERNAL_DATA_THRESHOLD = EXTERNAL_AT
MAIN = "model.onnx"
# torch 2.13: the dynamo exporter implements its ops from opset 18 and converts anything
# lower down with onnx's version converter; the TorchScript exporter's default stays 17.
DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}
# models with this many bytes of weights export on one torch thread (_run_exporter's
# comment says why): measured
# on decoders of 0.78-2 GB (one thread) and a CNN of 80 MB (two)
ONE_THREAD_FROM = 256 << 20


def export(
    model: Any,
    inputs: Any,
    *,
    workspace: Workspace | str | None = None,
    exporter: str = "torchscript",
    opset: int | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dynamic_axes: dict[str, Any] | None = None,
    inputs2: Any = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    moduleop: Any = (),
    backend: str = "onnxruntime",
    rewrite: bool = True,
    progress: Progress = False,
) -> Artifact:
    """Export ``model`` on example ``inputs`` to ONNX and check the result.

    ``dynamic_axes`` is {name: {axis: "dim name"}} (or {name: [axes]}) and is translated to
    ``dynamic_shapes`` for the dynamo exporter. ``inputs2`` is a second set of example inputs:
    torch and ONNX Runtime are compared on it to find branches or loops the trace froze.
    ``moduleop`` (module classes or class names) keeps each such submodule as one op: an
    ONNX local function named after the class (either exporter; see stages/moduleop.py).
    ``opset`` defaults to what each exporter handles (DEFAULT_OPSET: 17 for TorchScript,
    18 for dynamo, whose op library starts at 18; below that torch converts its output down,
    and what that writes is repaired where it is invalid, e.g. Split's opset-18
    ``num_outputs``).

    Args:
        model: the ``torch.nn.Module`` to export (put in eval mode for the export).
        inputs: example inputs: one tensor, a tuple of them, or a dict by forward()'s names.
        workspace: a Workspace or folder to write into (default ``workbench-runs/``).
        exporter: "torchscript" or "dynamo".
        opset: the ai.onnx opset; None picks the exporter's default.
        input_names, output_names: ONNX names of the graph inputs and outputs.
        dynamic_axes: axes that may vary, by input/output name.
        inputs2: a second set of example inputs, other shapes or values (trace checks).
        atol, rtol: the tolerance of the torch vs ONNX Runtime check on the outputs.
        external_data_threshold: bytes of weights above which they go to a side file,
            ``model.onnx.data`` (default 256 MiB: onnxruntime maps it rather than copying).
        moduleop: submodule classes (or class names) kept as one op each.
        backend: what the ONNX model is for, "onnxruntime" or "ncnn" (through
            ``wb.to_ncnn(artifact)``): the registered rewriters for that backend apply
            during the export (``wb.rewrite``; stages/rewriters.py).
        rewrite: False exports the model as written (no rewriter applies).
        progress: True shows a bar through the phases (the torch run, the exporter, the
            checks of the file, onnxruntime against torch); a callable gets each
            ``workbench.progress.Step`` instead; False shows nothing.

    Returns:
        An ``onnx`` Artifact; its ``diagnostics`` hold every trap found (a frozen
        ``.item()``, a branch not taken, an axis that is not dynamic), its ``metrics``
        the numeric check and its ``rewrites`` the rewriters that fired.

    Raises:
        ExportError: the exporter failed (the hint names the cause and the next step), or
            a rewriter changes the model's numbers (named).
        InputError: a bad argument (the message names it, what was expected and what came).
    """
    t0 = time.perf_counter()
    opset = _check_model_and_exporter(model, exporter, opset)
    args = as_tensor_tuple(inputs)
    check_arity(model, args)
    modules = resolve_moduleops(model, moduleop, exporter, opset)
    _check_backend(backend)

    warm(ORT_WARM)  # the numeric check's worker starts while torch exports
    steps = Steps(progress, "export", 5)
    steps.phase("running the model in torch (the reference)")
    with capture() as ref_cap:  # the model's own warnings belong in diagnostics too
        reference = run_torch(model, args, "example inputs")
    plan = choose(RewriteContext("export", backend, exporter, opset), enabled=rewrite)
    input_names = io_names(input_names, len(args), "input", "input_names", "example inputs")
    output_names = io_names(output_names, len(reference), "output", "output_names",
                            "model outputs", allow_fewer=True)
    axes = normalize_dynamic_axes(dynamic_axes, input_names, output_names, args)
    args2 = _second_inputs(inputs2, args)
    ws = as_workspace(workspace)
    # refused before the exporter runs when the memory available cannot hold its peak
    weights = module_bytes(model)
    check_fits(weights, f"exporting {type(model).__name__}", stage="export")

    diags: list[Diagnostic] = []
    with steps, ws.staging() as stage_dir:
        path = stage_dir / MAIN
        steps.advance()
        steps.phase(f"exporting (torch.onnx.export, {exporter}, opset {opset})")
        with hooks_restored(model, modules), plan.applied(), outputs_watched(plan, model):
            _run_exporter(model, args, path, exporter, opset, input_names, output_names, axes,
                          diags, ref_cap, modules, one_thread=weights >= ONE_THREAD_FROM)
        steps.advance()
        steps.phase("checking the rewriters against the model as written")
        with capture():  # the rewriters that fired, against the model as written
            verify(plan, model, args, reference, atol=atol, rtol=rtol)
        steps.advance()
        steps.phase("checking and writing the ONNX file (onnx.checker)")
        external = _finish_onnx(path, exporter, opset, modules, external_data_threshold, diags)
        save_reference(stage_dir, {n: a.detach().cpu().numpy()
                                   for n, a in zip(input_names, args, strict=True)}, reference)
        ws.prepare_commit(stage_dir)  # in threads while onnxruntime runs: commit finds it done
        steps.advance()
        steps.phase("checking numerics with onnxruntime against torch")
        with capture():  # torch re-runs for the checks; its warnings are already recorded
            metrics = numeric_checks(model, args, args2, reference, path, input_names, axes,
                                     atol, rtol, diags)
        params = {
            "exporter": exporter, "opset": opset, "input_names": input_names,
            "output_names": output_names, "dynamic_axes": axes, **_inputs_record(args),
            "model_class": type(model).__qualname__, "external_data": external,
            "atol": atol, "rtol": rtol, "moduleop": sorted(c.__qualname__ for c in modules),
            # where a model came from, when it says (the trained zoo's provenance)
            "model_source": getattr(model, "workbench_source", None), "backend": backend,
        }
        steps.advance()
        return ws.commit(stage_dir, stage="export", format="onnx", main=MAIN, params=params,
                         seconds=time.perf_counter() - t0, diagnostics=diags, metrics=metrics,
                         rewrites=plan.records)


# -- argument checks ---------------------------------------------------------------------------
def _check_model_and_exporter(model: Any, exporter: str, opset: int | None) -> int:
    """The opset to export at (None: the exporter's default), after refusing a model that is
    no ``nn.Module``, an unknown exporter, or an opset it cannot write."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}",
                         "pass the module object, e.g. wb.export(MyNet().eval(), (x,))")
    if exporter not in EXPORTERS:
        raise InputError(f"exporter={exporter!r} is not one of {EXPORTERS}",
                         "use 'torchscript' (torch.onnx.export dynamo=False) or 'dynamo' "
                         "(torch.export based)")
    if opset is None:  # each exporter at the opset it handles (see DEFAULT_OPSET)
        opset = DEFAULT_OPSET[exporter]
    check_opset(opset, exporter)
    return opset


def _check_backend(backend: Any) -> None:
    if backend not in BACKENDS:
        raise InputError(f"backend={backend!r} is not one of {BACKENDS}",
                         "the backend the ONNX model is for: 'onnxruntime', or 'ncnn' when it "
                         "goes on to wb.to_ncnn (its rewriters then apply)")


def _second_inputs(inputs2: Any, args: tuple) -> tuple | None:
    """``inputs2`` as tensors, one per example input (None when not given)."""
    args2 = as_tensor_tuple(inputs2, "inputs2") if inputs2 is not None else None
    if args2 is not None and len(args2) != len(args):
        raise InputError(f"inputs2 has {len(args2)} tensor(s), the example inputs "
                         f"{len(args)}", "give the same inputs at other values or shapes")
    return args2


def _inputs_record(args: tuple) -> dict[str, list]:
    return {"input_shapes": [list(a.shape) for a in args],
            "input_dtypes": [str(a.dtype).replace("torch.", "") for a in args]}


# -- running the exporter ----------------------------------------------------------------------
def _run_exporter(model: Any, args: tuple, path: Path, exporter: str, opset: int,
                  input_names: list[str], output_names: list[str],
                  axes: dict[str, dict[int, str]], diags: list[Diagnostic],
                  earlier: Any = None, modules: set | None = None,
                  one_thread: bool = False) -> None:
    import torch

    error: Exception | None = None
    args = copies(args)  # the trace runs forward(): a write into an input stays in the copy
    # ``one_thread``: a model of ONE_THREAD_FROM bytes exports on one thread. Its export is copying weights,
    # serial work, and a second thread raised the peak. With heap_held a 24-layer decoder
    # (2 GB) peaked at 4.1 GB in each of eight runs on one thread and at 5.3-6.4 GB in each
    # of six on two (on glibc's defaults two threads gave 4.1, 5.3 or 6.4 GB run to run). A
    # small model's export is its trace's forward pass and constant folding, compute that
    # two threads share: a wide CNN (80 MB) took 3.5 s on one thread, 2.75 s on two.
    with (capture() as cap, heap_held(),
          torch_threads(1) if one_thread else contextlib.nullcontext()):
        try:
            if exporter == "torchscript":
                torch.onnx.export(model, args, str(path), dynamo=False,
                                  opset_version=opset, input_names=input_names,
                                  output_names=output_names, dynamic_axes=axes or None,
                                  do_constant_folding=True,
                                  export_modules_as_functions=modules or False)
            else:

                prog = torch.onnx.export(
                    model, args, dynamo=True, opset_version=opset, input_names=input_names,
                    output_names=output_names, verbose=False,
                    custom_translation_table=translation_table(opset) or None,
                    dynamic_shapes=_dynamic_shapes(axes, input_names, args) if axes else None)
                prog.save(str(path))
        except Exception as e:  # translated below, after the capture is closed
            error = e
    if earlier is not None:
        cap.warnings[:0] = earlier.warnings
        cap.output = "\n".join(x for x in (earlier.output, cap.output) if x)
    diags.extend(warning_diagnostics(cap))
    if error is not None:
        raise export_error(error, exporter, opset, cap.output) from error


def _repair_down_converted(path: Path, opset: int, diags: list[Diagnostic]) -> None:
    """Fix what onnx's version converter leaves when torch's dynamo exporter writes below
    opset 18: a Split keeps opset 18's ``num_outputs`` attribute, which opsets 13-17 do not
    have (they take the sizes as a second input). The sizes come from shape inference;
    where the split axis is not static the model is left as it is (its checks say so)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    bad = [n for n in model.graph.node if n.op_type == "Split" and n.domain in ("", "ai.onnx")
           and any(a.name == "num_outputs" for a in n.attribute)]
    if not bad:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the checks that follow report the model as it is
        return
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None
                        for d in vi.type.tensor_type.shape.dim]
              for vi in [*inferred.graph.value_info, *inferred.graph.input,
                         *inferred.graph.output]}
    fixed = 0
    for node in bad:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        shape = shapes.get(node.input[0])
        if shape is None or len(node.input) > 1:
            continue
        axis = attrs.get("axis", 0) % len(shape)
        n, total = attrs["num_outputs"], shape[axis]
        if total is None:
            continue
        size = -(-total // n)  # opset 18: chunks of ceil(total / n), the last one smaller
        sizes = [size] * (n - 1) + [total - size * (n - 1)]
        name = f"{node.name or node.output[0]}_split_sizes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), name))
        node.input.append(name)
        keep = [a for a in node.attribute if a.name != "num_outputs"]
        del node.attribute[:]
        node.attribute.extend(keep)
        fixed += 1
    if fixed:

        atomic_write_bytes(path, model.SerializeToString())
        diags.append(Diagnostic(
            "info", "opset-down-converted",
            f"the dynamo exporter writes opset 18 and converted the model down to {opset}; "
            f"{fixed} Split node(s) kept opset 18's num_outputs and were repaired (split "
            "sizes as an input, as opsets 13-17 take them)",
            "export at opset=18 (the dynamo default) to skip the conversion"))


def _dynamic_shapes(axes: dict[str, dict[int, str]], input_names: list[str],
                    args: tuple) -> tuple:
    """dynamic_axes -> torch.export dynamic_shapes: one Dim per name, shared across inputs."""
    from torch.export import Dim

    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        ident = re.sub(r"\W", "_", name)
        ident = ident if ident and not ident[0].isdigit() else f"d_{ident}"
        return dims.setdefault(ident, Dim(ident))

    return tuple({a: dim(d) for a, d in axes.get(n, {}).items()} or None for n in input_names)


# -- after export ------------------------------------------------------------------------------
def _finish_onnx(path: Path, exporter: str, opset: int, modules: set, threshold: int,
                 diags: list[Diagnostic]) -> bool:
    """What the exporter wrote, set right and checked: a dynamo export converted below opset
    18 repaired, TorchScript's bool CumSum cast, the moduleop functions checked, the IR
    version lowered for onnxruntime, large weights moved to external data (True when they
    were), onnx.checker run. The model is parsed once (its external data never loaded) and
    written at most once; the checks read its structure, not its weights."""
    if exporter == "dynamo" and opset < 18:
        _repair_down_converted(path, opset, diags)
    if exporter != "torchscript":  # grouping module calls rewrites the file: before it is read
        diags += moduleop_diagnostics(path, modules, exporter)
    model, in_place = _read_exported(path, threshold)
    changed = exporter == "torchscript" and cast_bool_cumsum(model, diags)
    if exporter == "torchscript":
        diags += moduleop_diagnostics(path, modules, exporter, model)
    lowered = lower_ir_version(model)
    if lowered is not None:
        diags.append(lowered)
    external = _write_finished(model, path, threshold, changed or lowered is not None, diags,
                               in_place)
    mark_readable(path)  # what was written was read and checked here: the runners and the
    remember_summary(path, model)  # summaries that open it next need not parse it again
    problem = checker_problem(model)
    if problem is not None:
        diags.append(Diagnostic("error", "onnx-checker",
                                f"onnx.checker rejects the model: {problem}",
                                "the exporter wrote an invalid graph; try the other exporter "
                                "or another opset"))
    return external


def _read_exported(path: Path, threshold: int) -> tuple[Any, bool]:
    """What the exporter wrote, parsed, and whether its weights were left in the file: a
    file past ``threshold`` bytes holds its weights inline (torch writes external data only
    past 2 GB) and is about to move them to ``model.onnx.data``, so it is read without
    their bytes, each an external reference to its own place in the file
    (runtime/onnx_wire.py), and ``_write_finished`` makes the file itself the weights'
    data file (``_weights_where_they_lie``): parsing a 4-layer decoder's 1.3 GB and writing
    it out again through Python's copies of each tensor took 4-11 s, mostly page faults, and
    a copy by the kernel ~1 s; a smaller file is parsed whole."""
    import onnx
    from google.protobuf.message import DecodeError

    if path.stat().st_size <= threshold:
        return load_onnx(path, external_data=False), False
    try:
        return onnx.ModelProto.FromString(wire_graph(path).model), True
    except (ValueError, DecodeError):  # load_onnx says what is wrong with the file
        return load_onnx(path, external_data=False), False


def _weights_where_they_lie(model: Any, path: Path) -> None:
    """The exporter's own file renamed ``model.onnx.data`` and ``model`` (its weights
    referenced at their places in that file, ``_read_exported``) written as ``path``: no
    weight is copied. Each tensor lies where protobuf put it, between the graph's other
    bytes, not on a page; onnxruntime maps it all the same (a 4-layer decoder's session: 0.7
    s against 3.4 s inline, outputs bit-identical), as do onnx.load and pnnx."""
    data = path.with_name(path.name + ".data")
    os.replace(path, data)
    rename_location(model, path.name, data.name)
    path.write_bytes(model.SerializeToString())  # the graph alone: a few MB


def _write_finished(model: Any, path: Path, threshold: int, changed: bool,
                    diags: list[Diagnostic], in_place: bool = False) -> bool:
    """``model`` written to ``path`` when it changed, or with its initializers in one
    ``model.onnx.data`` file when they pass ``threshold`` bytes or the exporter wrote external
    data (torch writes one file per tensor past 2 GB), or when ``in_place`` (its weights
    referenced in ``path`` itself, ``_read_exported``). True when the weights are external."""
    size = summarize_onnx(model).initializer_bytes
    if not in_place and size <= threshold and not external_locations(model, path):
        if changed:  # no temp file, no fsync: the staging folder is the unit of atomicity
            path.write_bytes(model.SerializeToString())
        return False
    if in_place:
        _weights_where_they_lie(model, path)
    else:
        save_with_external_data(model, path, path.parent)
    diags.append(Diagnostic("info", "external-data",
                            f"initializers ({size} bytes) are stored in {path.name}.data "
                            f"beside {path.name} (threshold {threshold} bytes)",
                            "keep the two files together when you move the model"))
    return True
