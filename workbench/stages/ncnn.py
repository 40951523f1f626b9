"""ncnn stage: a torch module or an ONNX model -> pnnx -> ncnn, with pnnx run as a checked
subprocess.

pnnx's Python ``convert`` ignores the exit code of the binary it runs, and ``pnnx.export``
can raise after a good conversion (when importing its generated ``_pnnx.py`` fails), so the
binary is run here directly: a timeout, its log captured into diagnostics, and failure when
it exits non-zero or by a signal, leaves an output missing, or writes an ncnn param that
holds layers ncnn cannot load.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import shapes
from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import reference_data
from ..diagnostics import Diagnostic
from ..errors import ConversionError, InputError, WorkbenchError
from ..inputs import as_tensor_tuple, describe, run_torch
from ..params import parse_ncnn_param, parse_pnnx_param
from ..progress import Progress, Steps
from ..tolerances import check_tolerance, error_detail, for_precision, max_errors, within
from .ncnn_hints import capture_blobs, negative_pows, pnnx_param_of, rnn_hidden_state, shape_hint
from .ncnn_pooling import global_pools, wide_pools
from .pnnx_preflight import check_onnx_graph, check_second_shapes, input_names, opset_causes
from .pnnx_run import PNNX_PASSES, _check_exit, _hint_for, _log_diagnostics, _run_pnnx, _tail

_PNNX_TYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32",
               "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "u8"}


def pnnx_binary() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pnnx")
    if spec is None or spec.origin is None:
        raise ConversionError("pnnx is not installed", "pip install pnnx")
    exe = Path(spec.origin).parent / "pnnx"
    if not exe.exists():
        raise ConversionError(f"the pnnx package has no binary at {exe}", "pip install -U pnnx")
    return exe


def _shape_arg(tensors: tuple) -> str:
    parts = []
    for t in tensors:
        dt = _PNNX_TYPES.get(str(t.dtype).replace("torch.", ""))
        if dt is None:
            raise InputError(f"pnnx cannot take an input of dtype {t.dtype}",
                             "pass float32 or int64 example inputs")
        parts.append("[" + ",".join(str(int(d)) for d in t.shape) + "]" + dt)
    return ",".join(parts)


def to_ncnn(
    source: Any,
    inputs: Any = None,
    *,
    workspace: Workspace | str | None = None,
    fp16: bool = False,
    inputs2: Any = None,
    moduleop: tuple[str, ...] | list[str] | str = (),
    optlevel: int = 2,
    timeout: float = 600.0,
    progress: Progress = False,
    atol: float | None = None,
    rtol: float | None = None,
) -> Artifact:
    """Convert through pnnx; returns the ncnn Artifact whose parent is the pnnx Artifact.

    Args:
        source: an ``nn.Module`` (traced with ``inputs``), or an ONNX Artifact or path.
        inputs: example inputs; for an ONNX source they default to those stored at export.
        workspace: where to write (default: the source artifact's workspace).
        fp16: write fp16 weights (False keeps fp32).
        inputs2: a second shape for dynamic axes (pnnx's ``inputshape2``).
        moduleop: module classes kept as one op each.
        optlevel: pnnx's optimisation level.
        timeout: seconds pnnx may run before it is stopped.
        progress: a bar over tracing, pnnx's passes and the numeric check, or a callback.
        atol, rtol: the tolerance of the check of ncnn's fp32 run against torch on the
            example inputs: an output passes when max |torch - ncnn| <= atol + rtol *
            max |torch|. Default: the fp32 pair of ``workbench.tolerances`` (1e-4, 1e-3),
            or the fp16 pair (1e-2, 1e-2) when ``fp16`` writes fp16 weights. ncnn's fp16 run,
            when this CPU runs it in fp16 at all, is judged against the fp16 pair.

    Returns:
        The ncnn Artifact (``.ncnn.param`` + ``.ncnn.bin``), whose parent is the pnnx
        Artifact; ``diagnostics`` hold the output check (``ncnn-numeric-mismatch``: values
        past the tolerance; ``ncnn-shape-mismatch``; ``fp16-not-exercised``...), and
        ``ncnn-gelu-tanh`` when pnnx wrote GELU layers in erf form for the model's tanh
        GELU (transformers' gelu_new) and they were set to ncnn's tanh form (0=1), the
        outputs 10x nearer the reference so (stages/ncnn_gelu.py), and ``ncnn-global-pool``
        (info) when a Pooling whose kernel reaches past its map, which torch takes whole, was
        written as ncnn's whole-map pooling (stages/ncnn_pooling.py).

    Raises:
        ConversionError: pnnx failed (the tail of its log in the message).
    """
    import torch

    t0 = time.perf_counter()
    if optlevel not in (0, 1, 2):
        raise InputError(f"optlevel={optlevel!r} is not 0, 1 or 2", "pnnx's default is 2")
    moduleop = _moduleop_names(moduleop)
    default_tol = for_precision("fp16" if fp16 else "fp32")
    tol = check_tolerance(default_tol[0] if atol is None else atol,
                          default_tol[1] if rtol is None else rtol, "to_ncnn")
    parent: Artifact | None = None
    reference = None
    diags: list[Diagnostic] = []
    if isinstance(source, torch.nn.Module):
        if inputs is None:
            raise InputError("to_ncnn(module) needs example inputs to trace the module",
                             "wb.to_ncnn(model, (x,))")
        args = as_tensor_tuple(inputs)
        ws = as_workspace(workspace)
        kind = "torchscript"
    else:
        from .simplify import as_onnx_artifact

        parent = as_onnx_artifact(source, workspace, "to_ncnn")
        ws = parent.workspace if workspace is None and parent.workspace else as_workspace(workspace)
        if inputs is None:

            reference = reference_data(parent)
            if reference is None:
                raise InputError(f"to_ncnn({parent.path.name}) needs example inputs: the ONNX "
                                 "file carries no stored example", "wb.to_ncnn(path, (x,))")
            inputs = tuple(torch.from_numpy(v) for v in reference[0].values())
        args = as_tensor_tuple(inputs)
        kind = "onnx"
        check_onnx_graph(parent)  # no nodes: nothing to convert (pnnx segfaults)
    args2 = as_tensor_tuple(inputs2, "inputs2") if inputs2 is not None else None
    check_second_shapes(args, args2, input_names(source, parent))  # pnnx aborts on others

    with Steps(progress, "ncnn", 2 + len(PNNX_PASSES)) as steps, \
            tempfile.TemporaryDirectory(prefix="wb-pnnx-", dir=ws.path) as tmp_dir:
        tmp = Path(tmp_dir)
        steps.phase("tracing the module" if kind == "torchscript" else "reading the ONNX model")
        if kind == "torchscript":
            model_file = tmp / "model.pt"
            diags += _trace(source, args, model_file)
            ref_out = run_torch(source, args, "example inputs")
        else:
            model_file = tmp / "model.onnx"
            shutil.copy2(parent.path, model_file)
            for extra in parent.files:
                if extra.startswith(parent.path.name + ".") and extra.endswith(".data"):
                    shutil.copy2(parent.dir / extra, tmp / extra)
            # the torch outputs stored at export, or ONNX Runtime's on inputs given here
            ref_out = reference[1] if reference else _ort_outputs(parent, args)
        from .pnnx_customops import ncnn_finish, pnnx_prepare

        # @wb.custom_op nodes -> stand-ins pnnx keeps as one layer each (see pnnx_customops.py)
        custom = pnnx_prepare(model_file, args) if kind == "onnx" else []
        cmd = [str(pnnx_binary()), model_file.name, f"inputshape={_shape_arg(args)}",
               "device=cpu", f"optlevel={optlevel}", f"fp16={int(fp16)}"]
        if args2 is not None:
            cmd.append(f"inputshape2={_shape_arg(args2)}")
        if moduleop:
            cmd.append("moduleop=" + ",".join(moduleop))
        steps.advance()
        log, rc = _run_pnnx(cmd, tmp, timeout, steps)
        diags += _log_diagnostics(log)
        stem = "model"
        pnnx_files = [f"{stem}.pnnx.param", f"{stem}.pnnx.bin", f"{stem}_pnnx.py"]
        ncnn_files = [f"{stem}.ncnn.param", f"{stem}.ncnn.bin", f"{stem}_ncnn.py"]
        (tmp / "pnnx.log").write_text(log)
        _check_exit(rc, log, cmd, [d for d in diags if d.code == "unused-module-output"]
                    + opset_causes(parent, log))
        ncnn_finish(tmp / ncnn_files[0], custom, [tmp / pnnx_files[0]])  # named custom layers
        params = {"source": kind, "fp16": fp16, "optlevel": optlevel, "moduleop": moduleop,
                  "inputshape": _shape_arg(args),
                  "inputshape2": _shape_arg(args2) if args2 is not None else None,
                  "precision": "fp16" if fp16 else "fp32", "atol": tol[0], "rtol": tol[1],
                  "command": cmd, "model_source": getattr(source, "workbench_source", None)}
        missing = [f for f in pnnx_files[:2] if not (tmp / f).exists()]
        if missing:
            raise ConversionError(f"pnnx exited 0 but did not write {missing}" + _tail(log),
                                  _hint_for(log))
        diags += _unmatched_moduleops(tmp / pnnx_files[0], moduleop)
        pnnx_art = _commit(ws, tmp, pnnx_files + ["pnnx.log"], stage="pnnx", format="pnnx",
                           main=pnnx_files[0], parent=parent, params=params,
                           seconds=time.perf_counter() - t0, diagnostics=diags)
        missing = [f for f in ncnn_files[:2] if not (tmp / f).exists()]
        if missing:
            raise ConversionError(
                f"pnnx wrote the pnnx graph ({pnnx_art.id}) but not {missing}" + _tail(log),
                _hint_for(log))
        from ..runtime.ncnn_model import unloadable_layers

        bad = unloadable_layers(tmp / ncnn_files[0])
        if bad:
            listing = ", ".join(f"{t} ({n})" for t, n in bad[:8])
            raise ConversionError(
                f"the ncnn param holds {len(bad)} layer(s) ncnn cannot load: {listing}; the pnnx "
                f"graph is kept as {pnnx_art.id}" + _tail(log),
                rnn_hidden_state(tmp / pnnx_files[0]) or _hint_for(log, bad))
        steps.phase("running ncnn against the reference")
        from ..runtime.ncnn_masks import byte_mask_diagnostic, byte_masks
        from .ncnn_gelu import fix_gelu_form

        # a boolean attention mask stored as bytes: named before the run that it may crash
        masks = byte_masks(parse_ncnn_param(tmp / ncnn_files[0]))
        known = [byte_mask_diagnostic(masks)] if masks else []
        # a pool whose kernel reaches past its map, which torch takes whole: ncnn's global pool
        pooled = global_pools(tmp / ncnn_files[0], tmp / pnnx_files[0])
        metrics, checks = _check_numbers(tmp / ncnn_files[0], args, ref_out, tol, known)
        # pnnx's erf GELU for transformers' tanh GELU, set right when the outputs say so;
        # the check runs again on the param so written
        gelu = fix_gelu_form(tmp / ncnn_files[0], args, ref_out, metrics.get("max_abs"))
        if gelu is not None:
            metrics, checks = _check_numbers(tmp / ncnn_files[0], args, ref_out, tol, known)
            checks.insert(0, gelu)
        checks[:0] = known + ([pooled] if pooled else [])
        steps.advance(steps.total)
        return _commit(ws, tmp, ncnn_files, stage="ncnn", format="ncnn", main=ncnn_files[0],
                       parent=pnnx_art, params=params, seconds=time.perf_counter() - t0,
                       diagnostics=checks, metrics=metrics)


def _moduleop_names(moduleop: Any) -> list[str]:
    """Class names as pnnx's moduleop= wants them (TorchScript's, without ``__torch__.``)."""
    items = [moduleop] if isinstance(moduleop, (str, type)) else list(moduleop or ())
    names = []
    for item in items:
        if isinstance(item, type):
            from torch._jit_internal import _qualified_name

            item = _qualified_name(item)
        if not isinstance(item, str) or not item:
            raise InputError(f"moduleop entries are class names or nn.Module classes, got "
                             f"{item!r}", "e.g. moduleop=[Focus] or moduleop=['models.Focus']")
        names.append(item.removeprefix("__torch__."))
    return names


def _unmatched_moduleops(pnnx_param: Path, moduleop: list[str]) -> list[Diagnostic]:
    if not moduleop or not pnnx_param.exists():
        return []

    kept = {op.type for op in parse_pnnx_param(pnnx_param).ops}
    return [Diagnostic("warning", "moduleop-unmatched",
                       f"moduleop {name!r} matched no module: pnnx kept no op of that type",
                       "give the class as TorchScript names it (module path + class, e.g. "
                       "'models.common.Focus'), or pass the class itself")
            for name in moduleop if name not in kept]


def _commit(ws: Workspace, tmp: Path, names: list[str], **kw: Any) -> Artifact:
    with ws.staging() as d:
        for n in names:
            if not (tmp / n).exists():
                continue
            if n.endswith(".py"):  # the generated code names the temp folder: drop it
                (d / n).write_text((tmp / n).read_text().replace(str(tmp) + "/", ""))
            else:
                shutil.copy2(tmp / n, d / n)
        return ws.commit(d, **kw)


def _trace(model: Any, args: tuple, out: Path) -> list[Diagnostic]:
    import torch

    from .export_errors import warning_diagnostics

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
    from ..runtime.ort_runner import OrtRunner

    try:
        return list(OrtRunner(parent).run(args).values())
    except WorkbenchError:  # inputs the ONNX model does not take: pnnx will say more
        return None


# the passes pnnx announces ("############# pass_level2"), in order: progress within pnnx
def _check_numbers(param: Path, args: tuple, reference: list | None,
                   tol: tuple[float, float] | None = None, known: list[Diagnostic] = ()
                   ) -> tuple[dict[str, Any], list[Diagnostic]]:
    """ncnn fp32 and fp16 against torch on the example inputs: the fp32 run within ``tol``
    (atol, rtol; default fp32's), the fp16 run within the fp16 default; past it,
    ``ncnn-numeric-mismatch``. ``known``: errors found in the graph before the run (a
    byte mask, runtime/ncnn_masks.py); a failed or mismatching run points at them.

    Outputs are paired by position (out0...outN is the torch model's output order), each in
    the torch shape by ``workbench.shapes`` (a dropped or squeezed size-1 axis). When the fp16
    run returns exactly the fp32 outputs, ncnn ran no layer in fp16 here: ``max_abs_fp16`` is
    None and an ``fp16-not-exercised`` warning says so, rather than an fp16 figure that is
    the fp32 one. ``fp16_exercised`` records which."""
    metrics: dict[str, Any] = {}
    diags: list[Diagnostic] = []
    if reference is None:
        return metrics, diags
    runs: dict[str, list] = {}
    # the wide-pool and pow hints take a capture run: made once, for fp32 and fp16
    blobs = functools.cache(lambda: capture_blobs(param, args))
    rnn = functools.cache(lambda: rnn_hidden_state(pnnx_param_of(param)))  # h_n read
    for precision in ("fp32", "fp16"):
        key = "max_abs" if precision == "fp32" else "max_abs_fp16"
        metrics[key] = None
        try:
            got, fitted, errs = ncnn_errors(param, args, reference, precision)
        except Exception as e:  # recorded: the converted model is kept either way
            # the runner's error names the failing layer and its cause (ncnn_failure)
            message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            diags.append(Diagnostic("error", "ncnn-run-failed",
                                    f"ncnn ({precision}) cannot run the model on the example "
                                    f"inputs ({', '.join(map(describe, args))}): {message}",
                                    _known(known) or getattr(e, "hint", "") or "run NcnnRunner "
                                    "on the .param with the example inputs to see the failing "
                                    "layer"))
            continue
        runs[precision] = got
        if precision == "fp16" and _identical(runs.get("fp32"), got):
            metrics["max_rel_fp16"] = None
            metrics["fp16_exercised"] = False
            diags.append(_fp16_not_exercised())
            continue
        if precision == "fp16":
            metrics["fp16_exercised"] = True
        if errs["shape_mismatch"]:
            diags.append(Diagnostic("error", "ncnn-shape-mismatch",
                                    f"ncnn ({precision}) outputs differ in shape from torch: "
                                    f"{errs['shape_mismatch']}",
                                    rnn() or wide_pools(*blobs())
                                    or shape_hint(reference, fitted)))
        else:  # max_rel too: an absolute error alone hides a vanishing output
            metrics[key] = errs["max_abs"]
            metrics[key.replace("abs", "rel")] = errs["max_rel"]
            atol, rtol = for_precision(precision) if precision == "fp16" or tol is None \
                else tol
            if not within(errs, atol, rtol, reference):
                diags.append(_numeric_mismatch(precision, errs, atol, rtol,
                                               _known(known) or rnn()
                                               or negative_pows(*blobs())))
    return metrics, diags


def ncnn_errors(param: Path, args: tuple, reference: list, precision: str
                ) -> tuple[list, list, dict[str, Any]]:
    """ncnn's outputs on ``args`` as it returns them, the same fitted to torch's shapes
    (paired by position, ``shapes.fit``: a dropped or squeezed size-1 axis), and their
    ``max_errors`` against ``reference``. Raises what the runner raises."""
    import numpy as np

    from ..runtime.ncnn_runner import NcnnRunner

    got = list(NcnnRunner(param, precision=precision).run(args).values())
    fitted = [shapes.fit(np.asarray(g), np.shape(r)) for r, g in zip(reference, got,
                                                                     strict=False)] + got[
        len(reference):]
    return got, fitted, max_errors(reference, fitted)


def _numeric_mismatch(precision: str, errs: dict[str, Any], atol: float,
                      rtol: float, cause: str = "") -> Diagnostic:
    """ncnn's outputs have torch's shapes but other values: pnnx converted an op into
    something that computes otherwise (the comparison finds which; ``cause``, a hint
    pointing at an error already found in the graph, says it first)."""
    return Diagnostic(
        "error", "ncnn-numeric-mismatch",
        f"ncnn ({precision}) differs from torch on the example inputs: "
        f"{error_detail(errs, atol, rtol)} (all outputs: max abs {errs['max_abs']:.3g}, "
        f"max rel {errs['max_rel']:.3g})",
        cause or "the shapes agree but the values do not: a layer computes otherwise than "
        "torch (pnnx's own converted model does the same). wb.compare(model, [artifact], "
        "inputs) names the first layer that diverges; pass atol=/rtol= to to_ncnn if the "
        "error is expected")


def _known(known: list[Diagnostic]) -> str:
    """The hint of a failed or mismatching run when the graph already showed why."""
    return " ".join(f"likely cause: {d.code} ({d.message.split(':')[0]}); {d.hint}"
                    for d in known)


def _identical(a: list | None, b: list) -> bool:
    """Every output bit for bit the same (NaNs in the same places count as the same)."""
    import numpy as np

    return a is not None and len(a) == len(b) and all(
        np.shape(x) == np.shape(y) and np.array_equal(x, y, equal_nan=True)
        for x, y in zip(a, b, strict=True))


def _fp16_not_exercised() -> Diagnostic:
    import platform

    return Diagnostic(
        "warning", "fp16-not-exercised",
        f"ncnn's fp16 run (fp16 storage, packing and arithmetic on) returned outputs "
        f"bit-identical to its fp32 run: on this CPU ({platform.machine()}) ncnn computed "
        "every layer of this model in fp32, so no fp16 error was measured (max_abs_fp16 is "
        "None)",
        "ncnn on this CPU computed in fp32: measure fp16 on the target (an ARM CPU with fp16 "
        "arithmetic, ncnn.cpu_support_arm_asimdhp(), or a Vulkan GPU), or see what fp16 "
        "storage costs here: NcnnRunner(artifact, precision='fp16', emulate='arm-fp16')"
        ".run(inputs), or wb.compare(model, [that runner], inputs) op by op (every weight "
        "and blob rounded to fp16 between layers; storage only, not fp16 arithmetic). fp16 "
        "weights alone: wb.to_ncnn(model, inputs, fp16=True).metrics['max_abs']")
