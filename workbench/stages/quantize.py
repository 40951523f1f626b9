"""The quantize stage: an ONNX or ncnn artifact to int8, calibrated on the user's samples.

``wb.quantize(artifact, calibration, backend=...)`` returns a new Artifact (the parent is
kept and never touched) with the precision, the method, the calibration record (source,
seed, indices, sha256) and what stayed in float in its params, and the final-output SNR
against its parent in its metrics. ONNX Runtime: static QDQ or dynamic quantization through
onnxruntime.quantization (precision/ort_quant.py). ncnn: the calibration table and the int8
model in ncnn2table's and ncnn2int8's formats (precision/ncnn_calibration.py, int8_table.py, ncnn_int8.py).

A quantized model whose outputs equal its parent's bit for bit never ran in int8: that is
an error diagnostic, not a figure.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..checks import random_feeds, reference_data
from ..diagnostics import Diagnostic
from ..errors import InputError
from ..graph import TensorInfo
from ..onnx_io import load_onnx
from ..params import parse_ncnn_param
from ..precision import ort_quant
from ..precision.calibration import Calibration, load_calibration
from ..precision.ncnn_calibration import calibration_table
from ..precision.ncnn_int8 import write_int8_model
from ..precision.qdq import float_name
from ..precision.quantizable import quantizable
from ..precision.snr import snr_db
from ..progress import Progress, Steps
from ..runtime.ncnn_runner import NcnnRunner
from ..runtime.ort_runner import OrtRunner
from .simplify import INVALID_MODEL

BACKENDS = ("onnxruntime", "ncnn")
METHODS = {"onnxruntime": ("minmax", "entropy", "percentile"),
           "ncnn": ("kl", "aciq", "minmax")}
DEFAULT_METHOD = {"onnxruntime": "minmax", "ncnn": "kl"}


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
    requantize: bool = True,
    workspace: Workspace | str | None = None,
    progress: Progress = True,
) -> Artifact:
    """Quantize ``source`` to int8; returns the new Artifact.

    Args:
        source: an ONNX artifact (backend "onnxruntime") or an ncnn one (backend "ncnn").
        calibration: the samples (a ``Calibration``, or any source ``load_calibration``
            reads: an iterable of inputs, a DataLoader, a folder of .npy files or images);
            not needed with ``dynamic=True``.
        backend: "onnxruntime" or "ncnn"; None: the one ``source``'s format runs on.
        method: onnxruntime "minmax" (default), "entropy", "percentile"; ncnn "kl"
            (default), "aciq", "minmax".
        per_channel: per-output-channel weight scales (onnxruntime; ncnn always is).
        exclude: what stays in float: node / layer names, tensor names (their producer is
            kept), or records of a comparison (``rep.sensitive(k)``). A layer kept in float
            keeps its output float too: onnxruntime's Q/DQ pair on it is dropped (a ranked
            ReLU brings the conv it follows); for a record, ncnn, which rounds a blob inside
            the int8 layers that read it, keeps those readers float as well.
        dynamic: onnxruntime dynamic quantization of MatMul/Gemm weights (transformers),
            no calibration.
        limit, seed, transform: how calibration samples are picked and read.
        requantize: ncnn: hand int8 outputs from convolution to convolution (ncnn2int8's
            default).
        workspace: where the artifact goes (default: the source's workspace).
        progress: progress bars; or a callback given each phase (``workbench.progress``).
    """
    t0 = time.perf_counter()
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
    _refuse_invalid(source)
    ws = source.workspace if workspace is None and source.workspace else \
        as_workspace(workspace)
    cal = None
    # before any calibration or quantizing work: what stays float, and that something won't
    names = _exclude_names(exclude, source, backend)
    _refuse_all_float(exclude, names, source, backend, dynamic)
    # a callback hears the phases; progress=True keeps the calibration's own bars (per sample)
    bars = progress is True
    with Steps(progress if callable(progress) else False, "quantize", 3) as steps:
        if not dynamic:
            if calibration is None:
                raise InputError("quantize needs calibration samples (calibration=None)",
                                 "pass an iterable of model inputs, a DataLoader or a folder "
                                 "of .npy/images; or dynamic=True (onnxruntime) for none")
            steps.phase("reading calibration samples")
            cal = _calibration(calibration, source, backend, limit, seed, transform, bars)
        steps.advance()
        steps.phase(f"{backend} int8: " + ("dynamic, no calibration" if dynamic else
                                           f"calibrating on {len(cal.samples)} samples ({method})"))
        if backend == "onnxruntime":
            return _ort(source, ws, cal, method, per_channel, names, dynamic, t0, bars, steps)
        return _ncnn(source, ws, cal, method, names, requantize, t0, bars, steps)


def _refuse_invalid(source: Artifact) -> None:
    bad = next((d for d in source.diagnostics
                if d.level == "error" and d.code in (*INVALID_MODEL, "ncnn-run-failed")), None)
    if bad is not None:
        raise InputError(f"quantize refuses artifact {source.id}: its {source.stage} stage "
                         f"reported {bad.code}: {bad.message.splitlines()[0][:300]}",
                         f"fix what {source.stage} reported first, then quantize the new "
                         "artifact")
    if source.params.get("precision") == "int8":
        raise InputError(f"artifact {source.id} is already int8 ({source.stage})",
                         f"quantize its float parent ({source.parent_id}) instead")


def _calibration(calibration: Any, source: Artifact, backend: str, limit: int, seed: int,
                 transform: Any, progress: bool) -> Any:
    specs = _input_specs(source, backend)
    if isinstance(calibration, Calibration):
        calibration.check(specs, f"artifact {source.id}")
        return calibration
    return load_calibration(calibration, inputs=specs, limit=limit, seed=seed,
                            transform=transform, progress=progress)


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


def exclude_names(exclude: Iterable[Any], source: Artifact, backend: str) -> list[str]:
    """The node (ONNX) or layer (ncnn) names of ``source`` that ``wb.quantize(source, ...,
    exclude=exclude, backend=backend)`` keeps in float (checked: an unknown name is an
    InputError)."""
    return _exclude_names(exclude, source, backend)


def _exclude_names(exclude: Iterable[Any], source: Artifact, backend: str) -> list[str]:
    """Node (ONNX) or layer (ncnn) names from names, tensor names, or compare records."""
    if isinstance(exclude, (str, bytes)):
        exclude = [exclude]
    wanted = []
    records = set()  # names that came from comparison records (a ranking, not a user's list)
    for item in exclude or ():
        # a record of a comparison: the node/layer that wrote it (quantization keeps node
        # and layer names; tensor names it may change, e.g. onnxruntime's QDQ)
        name = getattr(item, "node", None) or getattr(item, "name", item)
        if not isinstance(name, str):
            raise InputError(f"exclude item {item!r} is a {type(item).__name__}",
                             "give node/layer names, tensor names, or records of "
                             "rep.sensitive(k)")
        if not isinstance(item, str):
            records.add(_float_name(name))
        wanted.append(_float_name(name) if not isinstance(item, str) else name)
    if not wanted:
        return []
    if backend == "onnxruntime":
        graph = load_onnx(source.path, external_data=False).graph
        nodes = [n.name for n in graph.node]
        producer = {o: n.name for n in graph.node for o in n.output}
        wanted += _weighted_before(graph, [producer.get(w, w) for w in wanted if w in records])
    else:
        layers = parse_ncnn_param(source.path).layers
        nodes = [ly.name for ly in layers]
        producer = {t: ly.name for ly in layers for t in ly.tops}
        runs_int8 = {ly.name for ly in quantizable(layers)}
        readers = _int8_readers(layers, runs_int8)
    out = []
    for name in wanted:
        layer = name if name in nodes else producer.get(name)
        if layer is not None and backend == "ncnn" and name in records:
            # a ranked record: its output reaches its readers in float too (the ranking
            # blames a tensor's rounding on its producer, and ncnn rounds a blob inside
            # each int8 layer that reads it: those stay float), as onnxruntime's exclude
            # drops the Q/DQ pair on the output; a layer ncnn runs in float anyway (a
            # LayerNorm, an attention) adds only its readers
            out.extend([layer] if layer in runs_int8 else [])
            out.extend(readers.get(layer, []))
            continue
        if name in nodes:
            out.append(name)
        elif name in producer:
            out.append(producer[name])
        else:
            _unknown(name, name in records, nodes + list(producer), source, backend)
    return list(dict.fromkeys(out))


def _unknown(name: str, record: bool, known: list[str], source: Artifact, backend: str
             ) -> None:
    """The InputError for an exclude name ``source`` has no node/layer or tensor of."""
    import difflib

    what = "node" if backend == "onnxruntime" else "layer"
    if record:  # a record of a comparison of another model: it would keep nothing float
        raise InputError(f"exclude record {name!r} names nothing in {source.id}: no {what} or "
                         "tensor of it is called so, so nothing would be kept float",
                         f"pass the ranking of a comparison of {source.id}'s own int8 child "
                         "(wb.quantize(parent, exclude=rep.sensitive(k)) with the parent that "
                         "was quantized), or name its nodes as strings")
    close = difflib.get_close_matches(name, known, n=3)
    raise InputError(f"exclude={name!r} is no {what} or tensor of {source.id}",
                     f"did you mean {close}?" if close else
                     f"names are listed by wb.summarize({source.id!r}) or `workbench inspect`")


def _int8_count(names: list[str], source: Artifact, backend: str, dynamic: bool
                ) -> tuple[int, int]:
    """(how many layers would run in int8 with ``names`` kept float, how many could): ONNX
    Runtime's weighted nodes (dynamic: MatMul/Gemm with a constant weight), ncnn's
    quantizable layers."""
    keep = set(names)
    if backend == "ncnn":
        layers = [ly.name for ly in quantizable(parse_ncnn_param(source.path).layers)]
    else:
        g = load_onnx(source.path, external_data=False).graph
        consts = {t.name for t in g.initializer}
        consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
        layers = [n.name for n in g.node if n.op_type in WEIGHTED and not (
            dynamic and (n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2
                         or n.input[1] not in consts))]
    return sum(name not in keep for name in layers), len(layers)


def _refuse_all_float(exclude: Any, names: list[str], source: Artifact, backend: str,
                      dynamic: bool) -> None:
    """An InputError, before any calibration or quantizing, when ``exclude`` keeps every
    layer that would run in int8 in float (the result would be the float model): naming how
    many would stay int8 (0), and the largest leading part of ``exclude`` that leaves some."""
    if not names:
        return
    stay, total = _int8_count(names, source, backend, dynamic)
    if stay:
        return
    items = [exclude] if isinstance(exclude, (str, bytes)) else list(exclude)
    best, lo, hi = None, 1, len(items) - 1  # fewer kept float, more int8: a binary search
    while lo <= hi:
        j = (lo + hi) // 2
        n = _int8_count(_exclude_names(items[:j], source, backend), source, backend,
                        dynamic)[0]
        if n:
            best, lo = (j, n), j + 1
        else:
            hi = j - 1
    ranked = not any(isinstance(i, str) for i in items)
    readers = (" (a ranked ncnn layer keeps the int8 layers that read its output float too: "
               "ncnn rounds a tensor inside each int8 layer that reads it)"
               if backend == "ncnn" and ranked else "")
    if best is None:
        hint = ("exclude fewer layers (at least one Conv/Gemm/MatMul must stay int8), or keep "
                "the float model: quantizing nothing gives nothing to measure")
    elif ranked:
        hint = (f"use a smaller k: exclude=rep.sensitive({best[0]}) leaves {best[1]} of "
                f"{total} in int8")
    else:
        hint = (f"drop names from exclude: its first {best[0]} leave {best[1]} of {total} in "
                "int8")
    what = "layers" if backend == "ncnn" else "Conv/Gemm/MatMul nodes"
    raise InputError(f"exclude keeps all {total} {what} {backend} would run in int8 in float "
                     f"({len(names)} kept float: {', '.join(names[:6])}"
                     f"{' ...' if len(names) > 6 else ''}){readers}: 0 would stay int8, "
                     "so quantizing would give the float model back", hint)


ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
               "Gelu", "Elu", "Selu", "Mish", "PRelu")
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _weighted_before(graph: Any, names: list[str]) -> list[str]:
    """The Conv/Gemm/MatMul feeding each activation node (or bias Add) in ``names`` when that
    node is its only reader: a ranked record of a fused conv+BN+ReLU names the ReLU, of a
    Linear on 3-D input the Add after its MatMul; the weighted op's own rounding (its
    weights, its output once the next node is float) is part of that layer: keeping the
    record's layer float keeps the weighted op float as well."""
    by_name = {n.name: n for n in graph.node}
    writer = {o: n for n in graph.node for o in n.output}
    consts = {t.name for t in graph.initializer}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    out = []
    for name in names:
        node = by_name.get(name)
        if node is None or not node.input:
            continue
        if node.op_type in ACTIVATIONS:
            data = node.input[0]
        elif node.op_type == "Add" and len(node.input) == 2 and (
                set(node.input) & consts or any(writer.get(i) is not None and
                                                writer[i].op_type == "Constant"
                                                for i in node.input)):
            # a Linear on 3-D input exports as MatMul + a bias Add: the record names the Add
            data = next(i for i in node.input if i not in consts and not (
                writer.get(i) is not None and writer[i].op_type == "Constant"))
        else:
            continue
        src = writer.get(data)
        if src is not None and src.op_type in WEIGHTED and readers.get(data) == 1:
            out.append(src.name)
    return out


def _int8_readers(layers: list[Any], runs_int8: set[str]) -> dict[str, list[str]]:
    """{ncnn layer: the int8 layers that read one of its tops, through Split copies}."""
    alias = {t: ly.bottoms[0] for ly in layers if ly.type == "Split" for t in ly.tops}
    writer = {t: ly.name for ly in layers if ly.type != "Split" for t in ly.tops}
    out: dict[str, list[str]] = {}
    for ly in layers:
        if ly.name not in runs_int8:
            continue
        for b in ly.bottoms:
            while b in alias:
                b = alias[b]
            if b in writer:
                out.setdefault(writer[b], []).append(ly.name)
    return out


def _float_name(name: str) -> str:
    return float_name(name)


def _ort(source: Artifact, ws: Workspace, cal: Any, method: str, per_channel: bool,
         exclude: list[str], dynamic: bool, t0: float, progress: bool, steps: Steps
         ) -> Artifact:
    main = "model.onnx"
    with ws.staging() as d:
        out = d / main
        if dynamic:
            res = ort_quant.quantize_dynamic_matmul(source.path, out, exclude=exclude)
        else:
            res = ort_quant.quantize_static_qdq(source.path, out, cal, method=method,
                                                per_channel=per_channel, exclude=exclude,
                                                progress=progress)
        steps.advance()
        steps.phase("checking the int8 model against its float parent")
        sample = cal.samples[0] if cal is not None else _example(source)
        diags, metrics = _check(OrtRunner(source.path), OrtRunner(out), sample, source)
        metrics.update({"quantized": len(res.quantized), "excluded": list(res.excluded)})
        diags.extend(Diagnostic("info", "quantizer-warning", w) for w in res.warnings)
        if not dynamic:
            diags.extend(_static_collapse(source, metrics))
        params = {"backend": "onnxruntime", "precision": "int8",
                  "format": "dynamic" if dynamic else "QDQ", "method": None if dynamic
                  else method, "per_channel": per_channel, "exclude": exclude,
                  "activation_type": res.activation_type, "weight_type": res.weight_type,
                  "reduce_range": res.reduce_range, "preprocess": res.preprocess,
                  "calibration": cal.to_record() if cal is not None else None}
        return ws.commit(d, stage="quantize", format="onnx", main=main, parent=source,
                         params=params, seconds=time.perf_counter() - t0, diagnostics=diags,
                         metrics=metrics)


def _ncnn(source: Artifact, ws: Workspace, cal: Any, method: str, exclude: list[str],
          requantize: bool, t0: float, progress: bool, steps: Steps) -> Artifact:
    main = "model.ncnn.param"
    fp32 = NcnnRunner(source, precision="fp32")
    table = calibration_table(fp32, cal.samples, method, progress=progress)
    with ws.staging() as d:
        table.write(d / "model.table")
        model = write_int8_model(source.path, None, table, d / main, d / "model.ncnn.bin",
                                 keep_float=exclude, requantize=requantize)
        steps.advance()
        steps.phase("checking the int8 model against its float parent")
        diags, metrics = _check(fp32, NcnnRunner(d / main, precision="fp32"),
                                cal.samples[0], source)
        metrics.update({"quantized": len(model.quantized), "kept_float": model.kept_float,
                        "unlisted": model.unlisted})
        params = {"backend": "ncnn", "precision": "int8", "method": method,
                  "per_channel": True, "exclude": exclude, "requantize": requantize,
                  "int8_blobs": model.int8_blobs, "calibration": cal.to_record()}
        return ws.commit(d, stage="quantize", format="ncnn", main=main, parent=source,
                         params=params, seconds=time.perf_counter() - t0, diagnostics=diags,
                         metrics=metrics)


# static int8 whose output keeps less than this SNR against its parent has lost the signal
COLLAPSE_DB = 3.0


def _static_collapse(source: Artifact, metrics: dict[str, Any]) -> list[Diagnostic]:
    """A static QDQ model of a MatMul graph (a transformer) whose output lost its signal:
    static ranges do not fit activations that vary per token, onnxruntime's dynamic MatMul
    quantization does (all-MiniLM-L6-v2: -1.3 dB static, 12.0 dB dynamic)."""
    snr = metrics.get("min_snr_db_vs_parent")
    if snr is None or snr >= COLLAPSE_DB or "MatMul" not in source.graph.op_histogram:
        return []
    return [Diagnostic(
        "warning", "int8-static-collapsed",
        f"static int8 kept {snr:.1f} dB of {source.id}'s output (below {COLLAPSE_DB:g} dB: the "
        "signal is lost) in a graph of MatMuls",
        "quantize the MatMuls dynamically instead: wb.quantize(onx, dynamic=True) (int8 "
        "weights, activations quantized at each run); or rank the layers "
        "(rep.sensitivity()) and keep the costly ones float with exclude=")]


def _example(source: Artifact) -> tuple:
    """The export's example inputs stored with the lineage (dynamic quantization has no
    calibration samples), else seeded random ones of the declared shapes."""
    ref = reference_data(source)
    feed = dict(ref[0]) if ref else random_feeds(source.graph, None, 0)[0]
    return tuple(feed[t.name] for t in source.graph.inputs)


def _check(parent: Any, child: Any, sample: tuple, source: Artifact
           ) -> tuple[list[Diagnostic], dict[str, Any]]:
    """The int8 model against its float parent on one calibration sample: SNR per output,
    and an error when every output is bit-identical (it never ran in int8)."""
    import numpy as np

    ref, got = parent.run(sample), child.run(sample)
    snrs = {name: snr_db(ref[name], got[name]) for name in ref if name in got}
    diags = []
    if snrs and all(np.array_equal(np.asarray(ref[n]), np.asarray(got[n])) for n in snrs):
        diags.append(Diagnostic(
            "error", "int8-not-exercised",
            f"the quantized model's outputs are bit-identical to {source.id}'s on the first "
            "calibration sample: no layer ran in int8",
            "check that some layer was quantized (metrics 'quantized') and not every one "
            "excluded"))
    finite = [v for v in snrs.values() if np.isfinite(v)]
    metrics = {"snr_db_vs_parent": snrs, "min_snr_db_vs_parent": min(finite)
               if finite else None}
    return diags, metrics


__all__ = ["quantize", "exclude_names", "BACKENDS", "METHODS"]
