"""The quantize stage: an ONNX or ncnn artifact to int8, calibrated on the user's samples.

``wb.quantize(artifact, calibration, backend=...)`` returns a new Artifact (the parent is
kept and never touched) with the precision, the method, the calibration record (source,
preprocessing, seed, indices, the held-out samples, sha256) and what stayed in float in its
params, and the SNR against its parent, measured on samples it was not calibrated on, in its
metrics (quantize_measure.py). ONNX Runtime: static QDQ or dynamic quantization through
onnxruntime.quantization (precision/ort_quant.py). ncnn: the calibration table and the int8
model in ncnn2table's and ncnn2int8's formats (precision/ncnn_calibration.py, int8_table.py,
ncnn_int8.py). What stays float is precision/exclusion.py.

Refused before any work: an artifact that is not ok (unless ``allow_failed=True``, which
leaves a warning on the child), exclusions naming nothing of the parent or everything.
Flagged before calibrating: samples whose range is far from the example inputs', images
read without the model's preprocessing (precision/calibration_range.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..diagnostics import Diagnostic
from ..errors import InputError
from ..graph import TensorInfo
from ..precision import ort_quant
from ..precision.calibration import Calibration, load_calibration
from ..precision.calibration_range import range_diagnostics
from ..precision.exclusion import exclude_names, refuse_all_float
from ..precision.ncnn_calibration import calibration_table
from ..precision.ncnn_int8 import write_int8_model
from ..precision.picking import AUTO
from ..progress import Progress, Steps
from ..runtime.ncnn_runner import NcnnRunner
from ..runtime.ort_runner import OrtRunner
from .quantize_measure import example_inputs, measure, static_collapse
from .simplify import INVALID_MODEL

BACKENDS = ("onnxruntime", "ncnn")
METHODS = {"onnxruntime": ("minmax", "entropy", "percentile"),
           "ncnn": ("kl", "aciq", "minmax")}
DEFAULT_METHOD = {"onnxruntime": "minmax", "ncnn": "kl"}
_exclude_names = exclude_names  # the name older callers import


@dataclass
class _Job:
    """What both backends' quantizing needs: the parent, where the child goes, the
    calibration, the names kept float, diagnostics carried to the child, the task."""

    source: Artifact
    ws: Workspace
    cal: Any
    method: str
    exclude: list[str]
    carried: list[Diagnostic]
    task: Any
    example: tuple | None
    t0: float
    progress: bool
    steps: Steps | None = None


def quantize(
    source: Artifact,
    calibration: Any = None,
    backend: str | None = None,
    *,
    method: str | None = None,
    per_channel: bool = True,
    exclude: Iterable[Any] = (),
    dynamic: bool = False,
    limit: int = 64,
    seed: int = 0,
    transform: Any = None,
    preprocess: Any = None,
    holdout: Any = AUTO,
    task: Any = None,
    example: Any = None,
    allow_failed: bool = False,
    requantize: bool = True,
    workspace: Workspace | str | None = None,
    progress: Progress = True,
) -> Artifact:
    """Quantize ``source`` to int8; returns the new Artifact.

    Args:
        source: an ONNX artifact (backend "onnxruntime") or an ncnn one (backend "ncnn").
        calibration: the samples: a ``Calibration``, a ``CalibrationSource``, or what
            ``load_calibration`` reads (inputs, a DataLoader, a folder of .npy or images).
        backend: "onnxruntime" or "ncnn"; None: the one ``source``'s format runs on.
        method: onnxruntime "minmax" (default), "entropy", "percentile"; ncnn "kl"
            (default), "aciq", "minmax".
        per_channel: per-output-channel weight scales (onnxruntime; ncnn always is).
        exclude: what stays float: node / layer or tensor names, records of a comparison
            (``rep.sensitive(k)``) or the names its ranking shows for the int8 model
            (``precision/exclusion.py``: a ranked layer keeps what its ranking measured).
        dynamic: onnxruntime dynamic quantization of MatMul/Gemm weights, no calibration.
        limit, seed: how many calibration samples are picked, and the seed of the pick.
        transform: for image folders, a PIL image -> array/tensor.
        preprocess: the model's preprocessing of each sample (``Preprocess``, a dict of its
            fields such as ``{"mean": [...], "std": [...]}``, or a callable); recorded.
        holdout: samples kept out of calibration to measure on: "auto", a count, a share
            in (0, 1), or 0 (``precision/picking.py``).
        task: a task metric (``wb.NearestNeighbour()``...) scoring the int8 outputs against
            the parent's over the held-out samples.
        example: the example inputs (default: those stored with the lineage), to check the
            calibration's range against and to measure on too (``example_snr_db``).
        allow_failed: quantize an artifact that is not ok anyway (the child keeps a
            ``quantized-from-failed`` warning).
        requantize: ncnn: hand int8 outputs from convolution to convolution (ncnn2int8's
            default).
        workspace: where the artifact goes (default: the source's workspace).
        progress: progress bars; or a callback given each phase (``workbench.progress``).

    Returns:
        The int8 Artifact: ``metrics["min_snr_db_vs_parent"]`` is the held-out median,
        ``metrics["heldout"]`` says where it was measured and its spread.
    """
    t0 = time.perf_counter()
    backend, method = _check_args(source, backend, method, dynamic)
    carried = _refuse_failed(source, allow_failed)
    ex = example_inputs(source, example)
    ws = source.workspace if workspace is None and source.workspace else \
        as_workspace(workspace)
    # before any calibration or quantizing work: what stays float, and that something won't
    names = exclude_names(exclude, source, backend)
    refuse_all_float(exclude, names, source, backend, dynamic)
    if not dynamic and calibration is None:
        raise InputError("quantize needs calibration samples (calibration=None)",
                         "pass an iterable of model inputs, a DataLoader or a folder of "
                         ".npy/images; or dynamic=True (onnxruntime) for none")
    job = _Job(source, ws, None, method, names, carried, task, ex, t0, progress is True)
    reading = {"limit": limit, "seed": seed, "transform": transform, "preprocess": preprocess,
               "holdout": holdout}
    return _run(job, backend, calibration, reading, progress, per_channel, dynamic, requantize)


def _run(job: _Job, backend: str, calibration: Any, reading: dict[str, Any],
         progress: Progress, per_channel: bool, dynamic: bool, requantize: bool) -> Artifact:
    """Read the calibration (flagging its range), quantize, measure: in three steps."""
    # a callback hears the phases; progress=True keeps the calibration's own bars (per sample)
    with Steps(progress if callable(progress) else False, "quantize", 3) as steps:
        job.steps = steps
        if not dynamic:
            steps.phase("reading calibration samples")
            job.cal = _calibration(calibration, job.source, backend, progress=job.progress,
                                   **reading)
            job.carried += _flag_ranges(job.cal, job.example, steps)
        steps.advance()
        steps.phase(f"{backend} int8: " + ("dynamic, no calibration" if dynamic else
                                           f"calibrating on {len(job.cal.samples)} samples "
                                           f"({job.method})"))
        if backend == "onnxruntime":
            return _ort(job, per_channel, dynamic)
        return _ncnn(job, requantize)


def _check_args(source: Any, backend: str | None, method: str | None, dynamic: bool
                ) -> tuple[str, str]:
    """(backend, method) checked against the source's format, or an InputError."""
    if not isinstance(source, Artifact):
        raise InputError(f"quantize takes an Artifact, got {type(source).__name__}",
                         "e.g. wb.quantize(wb.export(model, (x,)), samples) or "
                         "wb.quantize(wb.to_ncnn(model, (x,)), samples)")
    fmt_backend = {"onnx": "onnxruntime", "ncnn": "ncnn"}.get(source.format)
    if fmt_backend is None:
        raise InputError(f"quantize takes an ONNX or ncnn artifact; {source.id} is "
                         f"{source.format}", "quantize the artifact of export, simplify, "
                         "raise_ops or to_ncnn")
    backend = backend or fmt_backend
    if backend not in BACKENDS:
        raise InputError(f"backend={backend!r} is not one of {BACKENDS}",
                         "onnxruntime for an ONNX artifact, ncnn for an ncnn one")
    if backend != fmt_backend:
        raise InputError(f"backend={backend!r} cannot quantize {source.id}, a "
                         f"{source.format} artifact",
                         "convert first: wb.to_ncnn(artifact) for ncnn int8"
                         if backend == "ncnn" else "quantize the ONNX artifact the ncnn "
                         "model was converted from")
    method = method or DEFAULT_METHOD[backend]
    if method not in METHODS[backend]:
        raise InputError(f"method={method!r} is not one of {backend}'s {METHODS[backend]}",
                         f"{DEFAULT_METHOD[backend]} is the default")
    if dynamic and backend != "onnxruntime":
        raise InputError("dynamic=True is onnxruntime's dynamic quantization; ncnn has none",
                         "drop dynamic= for ncnn, or quantize the ONNX artifact")
    return backend, method


def _refuse_failed(source: Artifact, allow_failed: bool) -> list[Diagnostic]:
    """An InputError for an artifact that cannot or should not be quantized; for one that is
    not ok but allowed (``allow_failed``), the warning its child carries."""
    bad = next((d for d in source.diagnostics
                if d.level == "error" and d.code in (*INVALID_MODEL, "ncnn-run-failed")), None)
    if bad is not None:
        raise InputError(f"quantize refuses artifact {source.id}: its {source.stage} stage "
                         f"reported {bad.code}: {bad.message.splitlines()[0][:300]}",
                         f"fix what {source.stage} reported first, then quantize the new "
                         "artifact (this model cannot run, so allow_failed= cannot help)")
    if source.params.get("precision") == "int8":
        raise InputError(f"artifact {source.id} is already int8 ({source.stage})",
                         f"quantize its float parent ({source.parent_id}) instead")
    errors = [d for d in source.diagnostics if d.level == "error"]
    if not errors:
        return []
    codes = ", ".join(dict.fromkeys(d.code for d in errors))
    first = errors[0].message.splitlines()[0][:300]
    if not allow_failed:
        raise InputError(
            f"quantize refuses artifact {source.id}: it is not ok, its {source.stage} stage "
            f"reported {codes} ({first})",
            f"fix what {source.stage} reported and quantize the new artifact: int8 figures "
            "against a float model that is itself wrong say nothing; or pass "
            "allow_failed=True to quantize it anyway (the int8 artifact keeps a warning)")
    return [Diagnostic("warning", "quantized-from-failed",
                       f"quantized from {source.id}, which is not ok: its {source.stage} "
                       f"stage reported {codes} ({first})",
                       "the int8 figures compare against a float model that is itself "
                       f"wrong: fix {source.id} and quantize the new artifact")]


def _calibration(calibration: Any, source: Artifact, backend: str, *, limit: int, seed: int,
                 transform: Any, preprocess: Any, holdout: Any, progress: bool) -> Any:
    specs = _input_specs(source, backend)
    if isinstance(calibration, Calibration):
        if preprocess is not None or transform is not None:
            raise InputError("preprocess= (or transform=) is given with a Calibration, whose "
                             "samples are already read and prepared",
                             "pass the source itself with preprocess=, or load_calibration("
                             "source, preprocess=..., inputs=...) once and pass that")
        calibration.check(specs, f"artifact {source.id}")
        return calibration
    return load_calibration(calibration, inputs=specs, limit=limit, seed=seed,
                            transform=transform, preprocess=preprocess, holdout=holdout,
                            progress=progress)


def _flag_ranges(cal: Any, example: tuple | None, steps: Steps) -> list[Diagnostic]:
    """The calibration samples' range against the example inputs', before calibrating: the
    diagnostics, and the warning said in the progress phase as well."""
    found = range_diagnostics(cal.samples, cal.input_names, example, cal.source,
                              cal.default_images)
    warn = next((d for d in found if d.level == "warning"), None)
    if warn is not None:
        steps.phase(f"flagged: {warn.message[:160]}")
    return found


def _input_specs(source: Artifact, backend: str) -> list[Any]:
    """The model's declared inputs; for ncnn, the torch-layout shapes pnnx's _ncnn.py and
    .pnnx.param declare (the layout NcnnRunner.run takes), in the dtype the artifact's graph
    declares: torch's int64 token ids, which NcnnRunner.run narrows to the int32 ncnn reads
    (checking them against the runner's int32 refused the ids torch takes)."""
    import numpy as np

    if backend == "onnxruntime":
        return list(source.graph.inputs)
    runner = NcnnRunner(source, isolated=False)
    declared = list(source.graph.inputs)
    by_name = {t.name: t for t in declared}

    def dtype(i: int, name: str, narrowed: str) -> str:
        t = by_name.get(name) or (declared[i] if len(declared) == len(runner.in_specs)
                                  else None)
        try:
            kinds = {np.dtype(narrowed).kind, np.dtype(t.dtype).kind} if t else set()
        except TypeError:
            return narrowed
        return t.dtype if kinds and kinds <= set("iu") else narrowed

    return [TensorInfo(name, spec.shape if spec.shape is not None else spec.example_shape,
                       dtype(i, name, spec.dtype))
            for i, (name, spec) in enumerate(runner.in_specs.items())]


def _ort(job: _Job, per_channel: bool, dynamic: bool) -> Artifact:
    main, source, cal = "model.onnx", job.source, job.cal
    with job.ws.staging() as d:
        out = d / main
        if dynamic:
            res = ort_quant.quantize_dynamic_matmul(source.path, out, exclude=job.exclude)
        else:
            res = ort_quant.quantize_static_qdq(source.path, out, cal, method=job.method,
                                                per_channel=per_channel, exclude=job.exclude,
                                                progress=job.progress)
        job.steps.advance()
        job.steps.phase("checking the int8 model against its float parent, on held-out "
                        "samples")
        diags, metrics = measure(OrtRunner(source.path), OrtRunner(out), cal, source,
                                 job.task, job.example)
        metrics.update({"quantized": len(res.quantized), "excluded": list(res.excluded)})
        diags = job.carried + diags
        diags.extend(Diagnostic("info", "quantizer-warning", w) for w in res.warnings)
        if not dynamic:
            diags.extend(static_collapse(source, metrics))
        params = {"backend": "onnxruntime", "precision": "int8",
                  "format": "dynamic" if dynamic else "QDQ", "method": None if dynamic
                  else job.method, "per_channel": per_channel, "exclude": job.exclude,
                  "activation_type": res.activation_type, "weight_type": res.weight_type,
                  "reduce_range": res.reduce_range, "preprocess": res.preprocess,
                  "calibration": cal.to_record() if cal is not None else None}
        return job.ws.commit(d, stage="quantize", format="onnx", main=main, parent=source,
                             params=params, seconds=time.perf_counter() - job.t0,
                             diagnostics=diags, metrics=metrics)


def _ncnn(job: _Job, requantize: bool) -> Artifact:
    main, source, cal = "model.ncnn.param", job.source, job.cal
    fp32 = NcnnRunner(source, precision="fp32")
    table = calibration_table(fp32, cal.samples, job.method, progress=job.progress)
    with job.ws.staging() as d:
        table.write(d / "model.table")
        model = write_int8_model(source.path, None, table, d / main, d / "model.ncnn.bin",
                                 keep_float=job.exclude, requantize=requantize)
        job.steps.advance()
        job.steps.phase("checking the int8 model against its float parent, on held-out "
                        "samples")
        diags, metrics = measure(fp32, NcnnRunner(d / main, precision="fp32"), cal, source,
                                 job.task, job.example)
        metrics.update({"quantized": len(model.quantized), "kept_float": model.kept_float,
                        "unlisted": model.unlisted})
        params = {"backend": "ncnn", "precision": "int8", "method": job.method,
                  "per_channel": True, "exclude": job.exclude, "requantize": requantize,
                  "int8_blobs": model.int8_blobs, "calibration": cal.to_record()}
        return job.ws.commit(d, stage="quantize", format="ncnn", main=main, parent=source,
                             params=params, seconds=time.perf_counter() - job.t0,
                             diagnostics=job.carried + diags, metrics=metrics)


__all__ = ["quantize", "exclude_names", "BACKENDS", "METHODS"]
