"""int8 ONNX models through ``onnxruntime.quantization``: static QDQ and dynamic MatMul.

The quantizing is ONNX Runtime's own (``quant_pre_process``, ``quantize_static``,
``quantize_dynamic``); this module checks the inputs first (so a bad one is a hinted error,
not a traceback from inside the quantizer), checks afterwards that the output really is
quantized as reported, and writes it atomically.

Facts from onnxruntime 1.32's sources (``onnxruntime/quantization/quantize.py``,
``shape_inference.py``, ``onnx_model.py``) that this code relies on:

- QDQ is the recommended format on CPU since 1.11 (QOperator is slower on x64).
- CPU types: x86 without VNNI: uint8 activations, int8 weights, ``reduce_range=True``
  (7-bit weights, against the saturation of AVX2's u8s8 dot product); x86 with VNNI: the
  same with ``reduce_range=False``; ARM: int8 activations and weights (the docstring of
  ``quantize_static`` in 1.32; check it again on another release).
- ``quant_pre_process`` runs symbolic shape inference and ONNX Runtime's basic optimizer; the
  optimizer renames nodes it fuses (MatMul+Add -> ``<name>/MatMulAddFusion`` Gemm), so when a
  node named in ``exclude`` would vanish, pre-processing runs again without the optimizer.
- ``method="entropy"`` through ``quantize_static`` alone searches nothing (see
  ``ENTROPY_BINS``), so the ranges are computed by onnxruntime's own ``create_calibrator``
  with more bins and handed to ``quantize_static`` as its calibration cache
  (``calibration_cache_path``: present in 1.32; a release without it needs another way
  in, e.g. calling ``QDQQuantizer`` with the ranges).
- Dynamic quantization turns every Gemm into ``<name>_MatMul`` + ``<name>_Add`` *before* it
  reads ``nodes_to_exclude`` (1.32), so an excluded Gemm is passed under both names.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, QuantizationError
from ..fileio import atomic_write_bytes
from ..graph import summarize_onnx
from ..onnx_io import check_model_file, load_onnx
from .calibration import Calibration
from .ort_checks import (
    WEIGHTED_OPS,
    _check_exclude,
    _check_float32,
    _check_op_types,
    _check_out,
    _check_quantizable,
)
from .ort_failures import run_ort as _run_ort
from .qdq import float_outputs

METHODS = ("minmax", "entropy", "percentile")
PERCENTILE = 99.999  # onnxruntime's default for the percentile method
# Histogram bins of the entropy search. quantize_static (1.32) builds its EntropyCalibrater
# with 128 bins and 128 quantized bins and passes no bin count through, so its KL search has
# a single candidate, the full range: "entropy" = minmax. 512 bins gives 193 candidate
# clips at ~1.4x minmax's calibration time (2048, TensorRT's and ncnn's count, takes ~4x).
ENTROPY_BINS = 512
# Samples per calibration pass. onnxruntime's histogram calibrators (entropy, percentile)
# keep every activation of every sample of a pass in memory: ResNet-50 at 224x224, percentile,
# 16 samples peaked at 2.6 GB in one pass and 1.3 GB in passes of 4 (~115 MB a sample), so 64
# in one pass would take ~8 GB. Ranges are merged pass by pass (quantize_static's
# CalibStridedMinMax, which serves every method; minmax, which reduces inside the graph and
# keeps only min/max, merges exactly). Its CalibMaxIntermediateOutputs is not used: in 1.32
# it drops the outputs it collected without merging their ranges.
CALIB_CHUNK = 8


@dataclass
class OrtQuantResult:
    """What ONNX Runtime's quantization made.

    ``quantized``: nodes of the output graph that run on int8 values (every input through a
    DequantizeLinear; for dynamic quantization, the MatMul/Gemm nodes that became
    MatMulInteger); ``excluded``: the nodes kept in float as asked; ``preprocess``: what
    ``quant_pre_process`` did ("shape inference + optimizer", "shape inference only", or
    "none" when it failed); ``activation_type``/``weight_type``/``reduce_range``: the types
    chosen for this CPU; ``warnings``: what onnxruntime logged while quantizing (e.g. a
    per-channel axis it could not use), for diagnostics."""

    path: Path
    mode: str  # "static-qdq" or "dynamic"
    method: str | None
    per_channel: bool
    quantized: list[str]
    excluded: list[str]
    onnxruntime_version: str
    seconds: float
    activation_type: str = "uint8"
    weight_type: str = "int8"
    reduce_range: bool = False
    preprocess: str = ""
    op_histogram: dict[str, int] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        """JSON-able, for the manifest."""
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def cpu_types() -> tuple[str, str, bool]:
    """(activation type, weight type, reduce_range) onnxruntime 1.32 recommends for this CPU:
    ARM int8/int8; x86 uint8/int8, with 7-bit weights unless the CPU has VNNI."""
    machine = platform.machine().lower()
    if machine.startswith(("arm", "aarch")):
        return "int8", "int8", False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: assume no VNNI (the safe choice: no saturation)
        flags = ""
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags
    return "uint8", "int8", not vnni


def quantize_static_qdq(onnx_path: Any, out_path: str | Path, calibration: Calibration,
                        method: str = "minmax", per_channel: bool = True,
                        exclude: Any = (), op_types: Any = None,
                        progress: bool = True) -> OrtQuantResult:
    """Static int8 quantization in QDQ format (QuantizeLinear/DequantizeLinear pairs around
    each quantized op; ONNX Runtime's CPU provider fuses them into int8 kernels).

    Args:
        onnx_path: an fp32 ONNX model (Artifact or path).
        out_path: where the int8 model goes; written atomically, so a file there is replaced
            only when quantization succeeded.
        calibration: samples (``load_calibration``) that fit the model's inputs; the ranges
            of every activation are measured on them.
        method: how a range is chosen from what calibration saw: ``minmax`` (the extremes;
            no clipping), ``entropy`` (the clip of a 512-bin histogram whose 128-level
            quantization loses the least KL divergence), ``percentile`` (the 99.999th
            percentile of |x|, symmetric).
        per_channel: one weight scale per output channel (better accuracy on convolutions
            whose channels differ in range; a little slower); False: one per tensor.
        exclude: node names kept in float: their weights, their computation and their
            outputs (no QuantizeLinear/DequantizeLinear on them: ``float_outputs``); their
            inputs may still arrive dequantized.
        op_types: the op types to quantize (None: all onnxruntime quantizes).
        progress: a progress bar over the calibration runs.

    Returns:
        OrtQuantResult. Raises InputError for a bad input (float16 model, no quantizable op,
        an unknown node in ``exclude``, calibration that does not fit, an unwritable
        ``out_path``) and QuantizationError when onnxruntime fails or quantizes nothing.
    """
    t0 = time.perf_counter()
    src, model, exclude, op_types, out = _check_static(onnx_path, out_path, calibration,
                                                       method, exclude, op_types)
    types = cpu_types()
    act, weight, reduce_range = types
    with tempfile.TemporaryDirectory(prefix="wb-ortq-") as tmp:
        pre, how = _preprocess(src, Path(tmp), exclude)
        q, logged = _calibrate_and_quantize(src, model, pre, Path(tmp), calibration, method,
                                            per_channel, exclude, op_types, progress, types)
        qmodel, data = _read_output(q)
        if float_outputs(qmodel, exclude):
            data = qmodel.SerializeToString()
        quantized = _qdq_quantized(qmodel)
        ops = {n.name: n.op_type for n in qmodel.graph.node}
        _verify(quantized, [n for n in quantized if ops[n] in WEIGHTED_OPS], qmodel, exclude,
                src, ("QuantizeLinear", "DequantizeLinear"))
        _write(out, data)
    return OrtQuantResult(out, "static-qdq", method, per_channel, quantized, list(exclude),
                          _ort_version(), time.perf_counter() - t0, act, weight, reduce_range,
                          how, _histogram(qmodel), calibration.to_record(),
                          list(dict.fromkeys(logged)))


def _check_static(onnx_path: Any, out_path: str | Path, calibration: Any, method: str,
                  exclude: Any, op_types: Any) -> tuple[Path, Any, list[str], Any, Path]:
    """(source path, model, exclude, op_types, out path) once every input of
    ``quantize_static_qdq`` is checked: the method, the Calibration and its fit to the
    model's inputs, the names in ``exclude``, the op types, a float32 model with something
    to quantize, a writable ``out_path``."""
    if method not in METHODS:
        raise InputError(f"method={method!r} is not one of {METHODS}",
                         "minmax is the baseline; entropy or percentile clip outliers")
    if not isinstance(calibration, Calibration):
        raise InputError(f"calibration is a {type(calibration).__name__}, expected a "
                         "Calibration",
                         "make one with workbench.precision.calibration.load_calibration("
                         "source, inputs=model)")
    src, model = _load(onnx_path)
    exclude = _check_exclude(exclude, model, src)
    op_types = _check_op_types(op_types)
    _check_float32(model, src)
    _check_quantizable(model, src, exclude, op_types, dynamic=False)
    calibration.check(summarize_onnx(model).inputs, src.name)
    return src, model, exclude, op_types, _check_out(out_path, src)


def _calibrate_and_quantize(src: Path, model: Any, pre: Path, tmp: Path,
                            calibration: Calibration, method: str, per_channel: bool,
                            exclude: list[str], op_types: Any, progress: bool,
                            types: tuple[str, str, bool]) -> tuple[Path, list[str]]:
    """(the QDQ model onnxruntime wrote in ``tmp``, the warnings it logged): the calibration
    runs (for entropy, onnxruntime's calibrator first, its ranges passed as a cache) and
    ``quantize_static`` on the pre-processed model ``pre``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat

    act, weight, reduce_range = types
    calib_method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                    "percentile": CalibrationMethod.Percentile}[method]
    extra: dict[str, Any] = {"CalibPercentile": PERCENTILE} if method == "percentile" else {}
    extra["CalibStridedMinMax"] = _chunk(len(calibration))
    q = tmp / "int8.onnx"
    reader: Any = _Reader(calibration, progress, method)
    cache, logged = None, []
    if method == "entropy":
        cache = tmp / "ranges.json"
        logged += _run_ort("entropy calibration", src,
                           lambda: _entropy_ranges(pre, tmp, reader, op_types, cache))
        reader = None
    logged += _run_ort("quantize_static", src, lambda: _quantize_static(
        pre, q, reader, QuantFormat.QDQ, calib_method, per_channel, reduce_range, act,
        weight, exclude, op_types, extra, cache),
        {"per_channel": per_channel, "method": method, "model": model})
    return q, logged


def quantize_dynamic_matmul(onnx_path: Any, out_path: str | Path,
                            exclude: Any = ()) -> OrtQuantResult:
    """Dynamic int8 quantization of MatMul/Gemm weights (transformer-style models): weights
    stored in int8, activations quantized at run time per tensor (DynamicQuantizeLinear +
    MatMulInteger), so no calibration is needed.

    Args:
        onnx_path: an fp32 ONNX model (Artifact or path).
        out_path: where the int8 model goes (written atomically).
        exclude: MatMul/Gemm node names kept in float.

    Returns:
        OrtQuantResult (``quantized``: the MatMul/Gemm nodes of the pre-processed model that
        became MatMulInteger). Raises as ``quantize_static_qdq`` does.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    t0 = time.perf_counter()
    src, model = _load(onnx_path)
    exclude = _check_exclude(exclude, model, src)
    _check_float32(model, src)
    _check_quantizable(model, src, exclude, ["MatMul", "Gemm"], dynamic=True)
    out = _check_out(out_path, src)
    _, weight, reduce_range = cpu_types()  # activations: always uint8 in dynamic mode
    with tempfile.TemporaryDirectory(prefix="wb-ortq-") as tmp:
        pre, how = _preprocess(src, Path(tmp), exclude)
        premodel = _onnx_load(pre)
        gemms = {n.name for n in premodel.graph.node if n.op_type == "Gemm"}
        # 1.32 renames a Gemm to <name>_MatMul before it reads nodes_to_exclude
        names = list(exclude) + [f"{n}_MatMul" for n in exclude if n in gemms]
        q = Path(tmp) / "int8.onnx"
        logged = _run_ort("quantize_dynamic", src, lambda: quantize_dynamic(
            str(pre), str(q), op_types_to_quantize=["MatMul"], per_channel=False,
            reduce_range=reduce_range, weight_type=QuantType.QInt8,
            nodes_to_exclude=names, extra_options={"MatMulConstBOnly": True}))
        qmodel, data = _read_output(q)
        integer = {n.name for n in qmodel.graph.node if n.op_type == "MatMulInteger"}
        quantized = [n.name for n in premodel.graph.node if n.op_type in ("MatMul", "Gemm")
                     and ({f"{n.name}_quant", f"{n.name}_MatMul_quant"} & integer)]
        _verify(quantized, quantized, qmodel, exclude, src,
                ("DynamicQuantizeLinear", "MatMulInteger"))
        _write(out, data)
    return OrtQuantResult(out, "dynamic", None, False, quantized, list(exclude),
                          _ort_version(), time.perf_counter() - t0, "uint8", weight,
                          reduce_range, how, _histogram(qmodel), None,
                          list(dict.fromkeys(logged)))


# -- checks before ------------------------------------------------------------------------
def _load(onnx_path: Any) -> tuple[Path, Any]:
    src = Path(getattr(onnx_path, "path", onnx_path))
    if hasattr(onnx_path, "path") and getattr(onnx_path, "format", "onnx") != "onnx":
        raise InputError(f"{src.name} is a {onnx_path.format} artifact; ONNX Runtime "
                         "quantization takes an ONNX model",
                         "quantize the ONNX artifact (wb.export's), or use backend='ncnn'")
    check_model_file(src)
    return src, load_onnx(src)


def _onnx_load(path: Path) -> Any:
    return load_onnx(path)


# -- quantizing ---------------------------------------------------------------------------
def _chunk(n: int) -> int:
    """The largest number of samples <= CALIB_CHUNK that divides ``n`` (onnxruntime's
    strided calibration needs equal passes)."""
    return max(d for d in range(1, min(n, CALIB_CHUNK) + 1) if n % d == 0)


class _Reader:
    """onnxruntime's CalibrationDataReader over a Calibration (``set_range`` for passes of
    a few samples each), with a progress bar over all passes."""

    def __init__(self, calibration: Calibration, progress: bool, method: str) -> None:
        from tqdm.auto import tqdm

        self._cal = calibration
        self._feeds = calibration.feeds()
        self._bar = tqdm(total=len(calibration), desc=f"int8 calibration ({method})",
                         unit="sample", disable=not progress, leave=False)

    def __len__(self) -> int:
        return len(self._cal)

    def set_range(self, start_index: int, end_index: int) -> None:
        names = self._cal.input_names
        self._feeds = (dict(zip(names, s, strict=True))
                       for s in self._cal.samples[start_index:end_index])

    def get_next(self) -> dict[str, Any] | None:
        feed = next(self._feeds, None)
        if feed is not None:
            self._bar.update(1)
            if self._bar.n >= len(self._cal):
                self._bar.close()
        return feed


def _entropy_ranges(pre: Path, tmp: Path, reader: _Reader, op_types: Any,
                    cache: Path) -> None:
    """onnxruntime's EntropyCalibrater with ENTROPY_BINS bins, over the tensors
    quantize_static would calibrate; its ranges saved as a calibration cache."""
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        create_calibrator,
        save_tensors_data,
    )
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    ops = op_types or list(set(QLinearOpsRegistry) | set(QDQRegistry))
    calibrator = create_calibrator(pre, ops, augmented_model_path=str(tmp / "augmented.onnx"),
                                   calibrate_method=CalibrationMethod.Entropy,
                                   extra_options={"num_bins": ENTROPY_BINS,
                                                  "num_quantized_bins": 128})
    step = _chunk(len(reader))
    for start in range(0, len(reader), step):  # a pass at a time; histograms accumulate
        reader.set_range(start, start + step)
        calibrator.collect_data(reader)
    save_tensors_data(calibrator.compute_data(), cache)


def _quantize_static(pre: Path, q: Path, reader: _Reader | None, fmt: Any, calib_method: Any,
                     per_channel: bool, reduce_range: bool, act: str, weight: str,
                     exclude: list[str], op_types: Any, extra: dict[str, Any],
                     cache: Path | None) -> None:
    from onnxruntime.quantization import QuantType, quantize_static

    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    quantize_static(str(pre), str(q), reader, quant_format=fmt, op_types_to_quantize=op_types,
                    per_channel=per_channel, reduce_range=reduce_range,
                    activation_type=types[act], weight_type=types[weight],
                    nodes_to_exclude=list(exclude), calibrate_method=calib_method,
                    extra_options=extra, calibration_cache_path=cache)


def _preprocess(src: Path, tmp: Path, exclude: list[str]) -> tuple[Path, str]:
    """``quant_pre_process`` (symbolic shape inference and the basic optimizer, as
    onnxruntime recommends); without the optimizer when it would fuse away a node named in
    ``exclude``; the model as it is when pre-processing fails."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    for skip, how in ((False, "shape inference + optimizer"), (True, "shape inference only")):
        pre = tmp / f"pre{int(skip)}.onnx"
        try:
            quant_pre_process(str(src), str(pre), skip_optimization=skip)
        except Exception:  # noqa: BLE001 - onnxruntime's pre-processing is optional
            continue
        names = {n.name for n in _onnx_load(pre).graph.node}
        if all(e in names for e in exclude):
            return pre, how
    return src, "none"


# -- checks after -------------------------------------------------------------------------
def _read_output(q: Path) -> tuple[Any, bytes]:
    import onnx

    data = q.read_bytes()
    return onnx.load_from_string(data), data


def _qdq_quantized(model: Any) -> list[str]:
    """Nodes that compute on int8 values in a QDQ graph: a weighted op whose data and weight
    both come through DequantizeLinear; another op whose every input of data comes through
    one and whose outputs all go to QuantizeLinear."""
    g = model.graph
    producer = {o: n.op_type for n in g.node for o in n.output}
    consumers: dict[str, list[str]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    qdq = ("QuantizeLinear", "DequantizeLinear")
    out = []
    for n in g.node:
        if n.op_type in qdq or not n.input:
            continue
        from_dq = [producer.get(i) == "DequantizeLinear" for i in n.input if i]
        if n.op_type in WEIGHTED_OPS:
            ok = len(from_dq) > 1 and from_dq[0] and from_dq[1]
        else:
            ok = bool(from_dq) and from_dq[0] and all(
                consumers.get(o) and all(c == "QuantizeLinear" for c in consumers[o])
                for o in n.output)
        if ok:
            out.append(n.name)
    return out


def _verify(quantized: list[str], weighted: list[str], qmodel: Any, exclude: list[str],
            src: Path, ops: tuple[str, str]) -> None:
    """The output is int8 as reported: its quantize/dequantize nodes (``ops``) are there, at
    least one weighted op is quantized, and no excluded node is."""
    present = {n.op_type for n in qmodel.graph.node}
    kinds = "/".join(ops)
    if not set(ops) <= present or not weighted:
        raise QuantizationError(
            f"onnxruntime quantized nothing in {src.name}: the output has "
            f"{'no ' + kinds + ' nodes' if not set(ops) <= present else 'no int8 weighted op'}",
            "the model's Conv/Gemm/MatMul ops may lack shapes onnxruntime needs (run "
            "quant_pre_process), or op_types/exclude left nothing to quantize")
    leaked = [e for e in exclude if e in quantized]
    if leaked:
        raise QuantizationError(
            f"onnxruntime quantized {leaked} of {src.name}, which exclude keeps in float",
            "this onnxruntime renames nodes before it reads nodes_to_exclude; report it, "
            "and exclude the renamed node")


def _write(out: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(out, data)
    except OSError as e:
        raise InputError(f"out_path {str(out)!r} cannot be written: {e.strerror}",
                         "choose a folder you can write with room for the model") from e


def _histogram(model: Any) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node).most_common())


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__
