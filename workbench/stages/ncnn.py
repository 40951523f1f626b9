"""ncnn stage: a torch module or an ONNX model -> pnnx -> ncnn, with pnnx run as a checked
subprocess.

pnnx's Python ``convert`` ignores the exit code of the binary it runs, and ``pnnx.export``
can raise after a good conversion (when importing its generated ``_pnnx.py`` fails), so the
binary is run here directly: a timeout, its log captured into diagnostics, and failure when
it exits non-zero or by a signal, leaves an output missing, or writes an ncnn param that
holds layers ncnn cannot load.

``to_ncnn`` is the sequence; each step lives with its idea: what pnnx converts and the
reference (pnnx_source.py), the refusals before pnnx runs (pnnx_preflight.py), its command
(pnnx_command.py), running it and reading its log (pnnx_run.py), custom ops
(pnnx_customops.py), the output check (ncnn_check.py) and what may be set right after it
(ncnn_gelu.py, ncnn_pooling.py).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._capture import capture
from ..artifact.record import Artifact
from ..artifact.workspace import Workspace
from ..capacity import check_fits, module_bytes
from ..diagnostics import Diagnostic
from ..errors import ConversionError, InputError
from ..inputs import as_tensor_tuple
from ..params import parse_ncnn_param
from ..progress import Progress, Steps
from ..runtime.ncnn_masks import byte_mask_diagnostic, byte_masks
from ..runtime.ncnn_model import unloadable_layers
from ..runtime.ncnn_runner import WARM as NCNN_WARM
from ..runtime.worker import warm
from ..tolerances import check_tolerance, for_precision
from .ncnn_check import check_numbers
from .ncnn_gelu import fix_gelu_form
from .ncnn_hints import unloadable_hint
from .ncnn_pooling import global_pools
from .pnnx_command import moduleop_names, pnnx_command, shape_arg, unmatched_moduleops
from .pnnx_customops import ncnn_finish, pnnx_prepare
from .pnnx_preflight import check_second_shapes, input_names, opset_causes
from .pnnx_run import PNNX_PASSES, _check_exit, _hint_for, _log_diagnostics, _run_pnnx, _tail
from .pnnx_source import PnnxSource, link_or_copy, resolve_source, write_model_file
from .rewrite_session import choose, verify
from .rewriters import RewriteContext

PNNX_FILES = ["model.pnnx.param", "model.pnnx.bin", "model_pnnx.py"]
NCNN_FILES = ["model.ncnn.param", "model.ncnn.bin", "model_ncnn.py"]


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
    rewrite: bool = True,
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
        rewrite: for a module, the registered rewriters for backend "ncnn" (exporter
            "torchscript": pnnx reads a TorchScript trace) apply while it is traced, each
            checked against the module as written (``wb.rewrite``; stages/rewriters.py);
            False traces the module as written. An ONNX source is converted as it is.

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
        ExportError: a rewriter changes the module's numbers (named).
    """
    t0 = time.perf_counter()
    if optlevel not in (0, 1, 2):
        raise InputError(f"optlevel={optlevel!r} is not 0, 1 or 2", "pnnx's default is 2")
    moduleop = moduleop_names(moduleop)
    tol = _tolerance(fp16, atol, rtol)
    src = resolve_source(source, inputs, workspace)
    check_fits(module_bytes(src.model) if src.kind == "torchscript" else src.parent,
               "converting to ncnn (pnnx)", stage="to_ncnn")
    args2 = as_tensor_tuple(inputs2, "inputs2") if inputs2 is not None else None
    check_second_shapes(src.args, args2, input_names(source, src.parent))  # pnnx aborts on others
    ws = src.workspace
    # a module's rewriters for ncnn, while it is traced (an ONNX source is exported already)
    plan = choose(RewriteContext("to_ncnn", "ncnn", "torchscript", None),
                  enabled=rewrite and src.kind == "torchscript")

    with Steps(progress, "ncnn", 2 + len(PNNX_PASSES)) as steps, \
            tempfile.TemporaryDirectory(prefix="wb-pnnx-", dir=ws.path) as tmp_dir, \
            ws.staging("the pnnx graph") as pnnx_dir, ws.staging("the ncnn model") as ncnn_dir:
        tmp = Path(tmp_dir)
        steps.phase("tracing the module" if src.kind == "torchscript"
                    else "reading the ONNX model")
        with plan.applied():  # the module traced with its rewriters, when any matches
            model_file, ref_out, diags = write_model_file(src, tmp)
        if plan.calls:  # one fired: checked, and the reference is the module as written
            with capture():
                ref_out = verify(plan, src.model, src.args, None, atol=tol[0], rtol=tol[1])
        # @wb.custom_op nodes -> stand-ins pnnx keeps as one layer each (see pnnx_customops.py)
        custom = pnnx_prepare(model_file, src.args) if src.kind == "onnx" else []
        cmd = pnnx_command(model_file, src.args, args2, optlevel=optlevel, fp16=fp16,
                           moduleop=moduleop)
        steps.advance()
        warm(NCNN_WARM)  # the check's worker, while pnnx runs

        def on_pass(name: str) -> None:  # the pnnx graph is written: hashed while pnnx goes on
            if name == "ncnn":
                _stage_weights(tmp, {pnnx_dir: PNNX_FILES[1]})

        log = _convert(cmd, tmp, timeout, steps, diags, src.parent, on_pass)
        ncnn_finish(tmp / NCNN_FILES[0], custom, [tmp / PNNX_FILES[0]])  # named custom layers
        _stage_weights(tmp, {pnnx_dir: PNNX_FILES[1], ncnn_dir: NCNN_FILES[1]})
        params = _params(source, src, args2, cmd, fp16=fp16, optlevel=optlevel,
                         moduleop=moduleop, tol=tol)
        _require(tmp, PNNX_FILES[:2], log, "pnnx exited 0 but did not write")
        diags += unmatched_moduleops(tmp / PNNX_FILES[0], moduleop)

        @functools.cache
        def pnnx_art() -> Artifact:  # committed once: before an error names it, else after
            return _commit(ws, tmp, pnnx_dir, PNNX_FILES + ["pnnx.log"], stage="pnnx",
                           format="pnnx", main=PNNX_FILES[0], parent=src.parent,
                           params=params, seconds=time.perf_counter() - t0,
                           diagnostics=diags, rewrites=plan.records)

        if any(not (tmp / f).exists() for f in NCNN_FILES[:2]):
            _require(tmp, NCNN_FILES[:2], log,
                     f"pnnx wrote the pnnx graph ({pnnx_art().id}) but not")
        _require_loadable(tmp, pnnx_art, log)
        steps.phase("running ncnn against the reference")
        try:  # the check runs while the weights are hashed (_stage_weights)
            metrics, checks = _check_outputs(tmp, src, ref_out, tol)
        finally:  # the pnnx graph is kept whatever the check does
            parent = pnnx_art()
        steps.advance(steps.total)
        return _commit(ws, tmp, ncnn_dir, NCNN_FILES, stage="ncnn", format="ncnn",
                       main=NCNN_FILES[0], parent=parent, params=params,
                       seconds=time.perf_counter() - t0, diagnostics=checks, metrics=metrics,
                       rewrites=plan.records)


def _stage_weights(tmp: Path, where: dict[Path, str]) -> None:
    """Each weights file pnnx wrote (``where``: staging folder -> name in ``tmp``) linked
    into its artifact's staging folder now, and hashed there in the background while pnnx
    goes on or the output check runs (Workspace.prepare_commit); a link made later would
    change the file's ctime and so the key its hash is kept by (fileio.content_key). pnnx
    never writes a .bin again; the small files are linked at the commit (the output check
    may set a .param right). A file staged already is left as it is.

    The pnnx graph's .bin is staged when pnnx announces pass_ncnn: pnnx wrote and closed it
    before (its main: the pnnx graph saved, then its ONNX, then pass_ncnn), and the second
    core hashes it while pnnx (one thread there) converts to ncnn: 12 s of a 2 GB
    decoder's 52. Were a later pnnx to write it after, its digest would not be kept (the
    file changed while hashed: fileio._hash_and_keep) and the commit would hash it again."""
    for folder, name in where.items():
        if (tmp / name).exists() and not (folder / name).exists():
            link_or_copy(tmp / name, folder / name)
            Workspace.prepare_commit(folder)


def _tolerance(fp16: bool, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The output check's (atol, rtol): those given, else the default of the weights'
    precision."""
    default_tol = for_precision("fp16" if fp16 else "fp32")
    return check_tolerance(default_tol[0] if atol is None else atol,
                           default_tol[1] if rtol is None else rtol, "to_ncnn")


def _params(source: Any, src: PnnxSource, args2: tuple | None, cmd: list[str], *, fp16: bool,
            optlevel: int, moduleop: list[str], tol: tuple[float, float]) -> dict[str, Any]:
    """What both artifacts record of the conversion (the command, shapes, precision, the
    check's tolerance, and where the model came from)."""
    return {"source": src.kind, "fp16": fp16, "optlevel": optlevel, "moduleop": moduleop,
            "inputshape": shape_arg(src.args),
            "inputshape2": shape_arg(args2) if args2 is not None else None,
            "precision": "fp16" if fp16 else "fp32", "atol": tol[0], "rtol": tol[1],
            "command": cmd, "model_source": getattr(source, "workbench_source", None)}


def _convert(cmd: list[str], tmp: Path, timeout: float, steps: Steps,
             diags: list[Diagnostic], parent: Artifact | None,
             on_pass: Callable[[str], None] | None = None) -> str:
    """Run pnnx in ``tmp``, its log kept as ``pnnx.log`` and its warnings added to
    ``diags`` (``on_pass``: called with each pass pnnx announces); the log. Raises
    ConversionError when pnnx failed, naming the likely cause (a dropped submodule result,
    an opset past pnnx's)."""
    log, rc = _run_pnnx(cmd, tmp, timeout, steps, on_pass)
    diags += _log_diagnostics(log)
    (tmp / "pnnx.log").write_text(log)
    _check_exit(rc, log, cmd, [d for d in diags if d.code == "unused-module-output"]
                + opset_causes(parent, log))
    return log


def _require(tmp: Path, names: list[str], log: str, what: str) -> None:
    """ConversionError ``{what} {missing}`` when pnnx left any of ``names`` unwritten."""
    missing = [f for f in names if not (tmp / f).exists()]
    if missing:
        raise ConversionError(f"{what} {missing}" + _tail(log), _hint_for(log))


def _require_loadable(tmp: Path, pnnx_art: Callable[[], Artifact], log: str) -> None:
    """ConversionError naming the layers of the ncnn param that ncnn cannot load (the pnnx
    graph committed first, ``pnnx_art()``, and named)."""
    bad = unloadable_layers(tmp / NCNN_FILES[0])
    if bad:
        art = pnnx_art()
        listing = ", ".join(f"{t} ({n})" for t, n in bad[:8])
        raise ConversionError(
            f"the ncnn param holds {len(bad)} layer(s) ncnn cannot load: {listing}; the pnnx "
            f"graph is kept as {art.id}" + _tail(log),
            unloadable_hint(tmp / PNNX_FILES[0], bad, art) or _hint_for(log, bad))


def _check_outputs(tmp: Path, src: PnnxSource, ref_out: list | None,
                   tol: tuple[float, float]) -> tuple[dict[str, Any], list[Diagnostic]]:
    """The output check (ncnn_check.py), with what the graph shows first and what it sets
    right: a byte attention mask (named before the run it may crash), pools wider than
    their map (written as global pools), and pnnx's erf GELU for a tanh GELU (set to the
    tanh form when the outputs say so, and checked again)."""
    param = tmp / NCNN_FILES[0]
    masks = byte_masks(parse_ncnn_param(param))
    known = [byte_mask_diagnostic(masks)] if masks else []
    pooled = global_pools(param, tmp / PNNX_FILES[0])
    metrics, checks = check_numbers(param, src.args, ref_out, tol, known)
    gelu = fix_gelu_form(param, src.args, ref_out, metrics.get("max_abs"))
    if gelu is not None:
        metrics, checks = check_numbers(param, src.args, ref_out, tol, known)
        checks.insert(0, gelu)
    checks[:0] = known + ([pooled] if pooled else [])
    return metrics, checks


def _commit(ws: Workspace, tmp: Path, staging: Path, names: list[str], **kw: Any
            ) -> Artifact:
    """The files ``names`` of ``tmp`` (those written; a file staged already is kept)
    committed from ``staging`` as one artifact."""
    for n in names:
        if not (tmp / n).exists() or (staging / n).exists():
            continue
        if n.endswith(".py"):  # the generated code names the temp folder: drop it
            (staging / n).write_text((tmp / n).read_text().replace(str(tmp) + "/", ""))
        else:  # a link, not a copy of the weights; tmp's files are never written into
            link_or_copy(tmp / n, staging / n)  # after their commit
    return ws.commit(staging, **kw)
