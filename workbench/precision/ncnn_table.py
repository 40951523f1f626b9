"""ncnn's int8 calibration table, computed and written as ncnn's ``ncnn2table`` does.

The ncnn wheel ships neither ``ncnn2table`` nor ``ncnn2int8``, so the table is made here: the
fp32 model runs on the calibration samples (``NcnnRunner``), and for every Convolution,
ConvolutionDepthWise and InnerProduct layer the table holds

- ``<layer>_param_0 s0 s1 ...``: its weight scales, one per output channel (per group for a
  depthwise convolution), ``127 / absmax`` of that channel's weights (``31 / absmax`` for a
  3x3 stride-1 convolution, whose int8 winograd kernel takes 6-bit weights);
- ``<layer> s``: the scale of the blob it reads, ``127 / threshold``, the threshold found by
  the method: ``kl`` (a 2048-bin histogram of |x| up to the absmax over all samples, and the
  clip point from 128 bins on whose 128-level quantization loses the least KL divergence),
  ``aciq`` (the Gaussian clip of the absmax for 8 bits) or ``minmax`` (the absmax itself: no
  clipping; not one of ncnn2table's methods, the plain baseline the other two improve on).

Format and arithmetic follow ncnn's ``tools/quantize/ncnn2table.cpp`` (ncnn 1.0.20261020,
the wheel installed here; source at Tencent/ncnn a4d2ea1): scales printed with ``%f``, each
value followed by a space, weight lines first, then blob lines, no blank line (ncnn2int8
stops reading at one). The code is this project's own: the histogram bins are counted with
numpy and the KL search runs over all thresholds at once (``kl_threshold``; integer
arithmetic for the bin edges), so a near tie between two thresholds may resolve to the neighbour ncnn's float32 sums pick.

A MultiHeadAttention gets ncnn2table's four weight lines (``<layer>_param_0`` to ``_3``:
127 / absmax of each row of its q, k and v weights, one for all of out) and no blob line.
A Gemm gets no line: ncnn2table writes none, and ncnn2int8's ``quantize_gemm`` quantizes
every Gemm from its constant weights alone (``ncnn_int8``), its input quantized per row at
run time by ncnn's Gemm.

Two additions ncnn2int8 reads harmlessly (a key with no layer of that name, or a key with
``_param_`` that no layer asks for): a first line ``#workbench method=kl samples=32``, and
the lines of layers kept in float written commented out (``#conv1_param_0 ...``, ``#conv1
...``; ncnn's README says to comment the weight line only, but ncnn2int8 then stops
quantizing the layers after it, so both lines are commented).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, ModelFileError

QUANTIZABLE = ("Convolution", "ConvolutionDepthWise", "InnerProduct")
METHODS = ("kl", "aciq", "minmax")
BINS = 2048  # ncnn2table's histogram
TARGET_BINS = 128  # int8 levels on one side of zero
_KL_EPS = 1e-4
_HEADER = "#workbench"
# ncnn2table's alpha for the Gaussian clip, by bit count (index = bits - 1)
_ALPHA_GAUSSIAN = (0.0, 1.71063519, 2.15159277, 2.55913646, 2.93620062, 3.28691474,
                   3.6151146, 3.92403714)


@dataclass
class Int8Table:
    """An ncnn int8 calibration table.

    ``weight_scales``: layer name -> its per-output-channel weight scales (per group for a
    depthwise convolution); ``blob_scales``: layer name -> the scale(s) of the blob it reads
    (one value as ncnn2table writes); ``float_layers``: layers kept in float (their lines
    commented out); ``method`` and ``samples``: how the table was made (None when read from
    a table ncnn2table wrote); ``thresholds``: layer name -> (absmax, threshold) of its input
    blob, for reports (not written)."""

    weight_scales: dict[str, Any] = field(default_factory=dict)
    blob_scales: dict[str, Any] = field(default_factory=dict)
    method: str | None = None
    samples: int | None = None
    float_layers: list[str] = field(default_factory=list)
    thresholds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # layer name -> its ``_param_1``, ``_param_2``, ... weight scales (a MultiHeadAttention's
    # k, v and out weights; an RNN's second weights, read and kept, not applied)
    more_weight_scales: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def layers(self) -> list[str]:
        """Every layer the table has a line for (float ones included), in table order."""
        seen = dict.fromkeys(list(self.weight_scales) + list(self.blob_scales)
                             + self.float_layers)
        return list(seen)

    def text(self) -> str:
        """The table in ncnn2table's text format (see the module's docstring)."""
        out = []
        if self.method is not None or self.samples is not None:
            out.append(f"{_HEADER} method={self.method} samples={self.samples}")
        floats = set(self.float_layers)
        for name, scales in self.weight_scales.items():
            mark = "#" if name in floats else ""
            out.append(f"{mark}{name}_param_0 " + "".join(f"{float(s):f} " for s in scales))
            for i, more in enumerate(self.more_weight_scales.get(name, ()), 1):
                out.append(f"{mark}{name}_param_{i} " + "".join(f"{float(s):f} "
                                                               for s in more))
        for name, scales in self.blob_scales.items():
            mark = "#" if name in floats else ""
            out.append(f"{mark}{name} " + "".join(f"{float(s):f} " for s in scales))
        return "".join(line + "\n" for line in out)

    def write(self, path: str | Path) -> Path:
        """Write the table to ``path`` atomically (a temp file and a rename)."""
        from ..fileio import atomic_write_text

        path = Path(path)
        atomic_write_text(path, self.text())
        return path


def read_table(path: str | Path) -> Int8Table:
    """Read a calibration table as ncnn2int8 does: ``<layer>_param_<n>`` lines are weight
    scales, other lines blob scales; ``#``-commented lines name layers kept in float.

    Args:
        path: a table written by ``Int8Table.write`` or by ncnn's ncnn2table.

    Returns:
        The Int8Table: ``_param_0`` lines in ``weight_scales``, ``_param_1`` on in
        ``more_weight_scales`` (a MultiHeadAttention's k, v and out weights). Raises ModelFileError naming the line that is not a table line.
    """
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"calibration table {str(path)!r} is not a file",
                             "write one with calibration_table(...).write(path), or pass the "
                             "file ncnn2table wrote")
    table = Int8Table()
    floats: dict[str, None] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                 .splitlines(), 1):
        parts = raw.split()
        if not parts:
            break  # ncnn2int8 stops at an empty line: so do we, or we would read more
        key, values = parts[0], parts[1:]
        if key == _HEADER:
            info = dict(v.split("=", 1) for v in values if "=" in v)
            table.method = None if info.get("method") in (None, "None") else info["method"]
            n = info.get("samples", "None")
            table.samples = int(n) if n.isdigit() else None
            continue
        commented = key.startswith("#")
        key = key.lstrip("#")
        if not key:
            continue  # a comment
        try:
            scales = np.array([float(v) for v in values], dtype=np.float32)
        except ValueError:
            if commented:
                continue  # a comment, not a commented-out table line
            raise ModelFileError(
                f"calibration table {path.name}, line {lineno}: expected '<name> <scale> "
                f"<scale> ...', got {raw.strip()[:80]!r}",
                "a table line is a layer name and its scales (ncnn2table's format); "
                "write the table again with calibration_table(...).write(path)") from None
        m = re.fullmatch(r"(.+)_param_(\d+)", key)
        name = m.group(1) if m is not None else key
        if m is not None and m.group(2) != "0":
            if values:  # a MultiHeadAttention's k, v, out (an RNN's second weights)
                more = table.more_weight_scales.setdefault(name, [])
                more.extend([None] * (int(m.group(2)) - len(more)))
                more[int(m.group(2)) - 1] = scales
            continue
        if commented:
            floats[name] = None
        if not values:
            continue
        if m is not None:
            table.weight_scales[name] = scales
        else:
            table.blob_scales[name] = scales
    table.float_layers = list(floats)
    return table


# -- the scales ----------------------------------------------------------------------------


def _int(layer: Any, key: int, default: int = 0) -> int:
    v = layer.params.get(key)
    return default if v is None else int(float(v if isinstance(v, str) else v[0]))


def weight_rows(layer: Any, weights: Any) -> Any:
    """The weights of ``layer`` as rows, one per scale: (num_output, -1) for Convolution
    and InnerProduct, (group, -1) for ConvolutionDepthWise (as ncnn quantizes them)."""
    rows = _int(layer, 7, 1) if layer.type == "ConvolutionDepthWise" else _int(layer, 0)
    return weights.reshape(rows, -1)


def six_bit(layer: Any) -> bool:
    """A 3x3, stride-1, dilation-1 Convolution: ncnn's int8 winograd (F43) takes its
    weights in 6 bits, so ncnn2table scales them to 31 rather than 127."""
    if layer.type != "Convolution":
        return False
    kw = _int(layer, 1)
    dw, sw = _int(layer, 2, 1), _int(layer, 3, 1)
    return ((kw, _int(layer, 11, kw), dw, _int(layer, 12, dw), sw, _int(layer, 13, sw))
            == (3, 3, 1, 1, 1, 1))


def aciq_clip(absmax: float, n: int, bits: int = 8) -> float:
    """ACIQ's clip for a Gaussian whose largest |value| among ``n`` is ``absmax``."""
    gaussian_const = (0.5 * 0.35) * (1 + math.sqrt(math.pi * math.log(4)))
    std = (absmax * 2 * gaussian_const) / math.sqrt(2 * math.log(n))
    return float(_ALPHA_GAUSSIAN[bits - 1] * std)


def weight_scales(layer: Any, weights: Any, method: str) -> Any:
    """Per-row scales of ``layer``'s fp32 ``weights`` as ncnn2table computes them: the
    absmax (kl, minmax) or its Gaussian clip (aciq) mapped to 127, or 31 for 6-bit
    weights. A row of zeros gets 1.0 (ncnn divides by its zero absmax; any scale quantizes
    zeros to zeros)."""
    import numpy as np

    rows = weight_rows(layer, np.asarray(weights, dtype=np.float32))
    absmax = np.abs(rows).max(axis=1).astype(np.float64)
    levels, bits = (31.0, 6) if six_bit(layer) else (127.0, 8)
    if method == "aciq":
        n = rows.shape[1]
        thr = np.array([aciq_clip(a, n, bits) if n > 1 else a for a in absmax])
    else:
        thr = absmax
    with np.errstate(divide="ignore"):
        scales = np.where(thr > 0, levels / np.where(thr > 0, thr, 1.0), 1.0)
    return scales.astype(np.float32)


def absmax_scales(rows: Any, per_row: bool = True) -> Any:
    """``127 / absmax`` in float32 of each row of ``rows`` (or, ``per_row=False``, one for
    all of them), 1.0 where the absmax is 0: how ncnn2int8 scales a Gemm's constant A (per
    row) and B (one) and ncnn2table a MultiHeadAttention's q, k, v (per row) and out (one)
    weights, in float32 arithmetic as they do."""
    import numpy as np

    a = np.abs(np.asarray(rows, dtype=np.float32))
    absmax = a.max(axis=1) if per_row else np.array([a.max() if a.size else 0], np.float32)
    one = np.float32(1)
    return np.where(absmax == 0, one, np.float32(127) / np.where(absmax == 0, one, absmax)
                    ).astype(np.float32)


def histogram(values: Any, absmax: float) -> Any:
    """ncnn2table's 2048-bin histogram of |values| on [0, absmax]; exact zeros skipped."""
    import numpy as np

    a = np.abs(np.asarray(values, dtype=np.float32).ravel())
    a = a[a != 0]
    idx = (a / np.float32(absmax) * np.float32(BINS)).astype(np.int64)  # float32, as ncnn
    return np.bincount(np.minimum(idx, BINS - 1), minlength=BINS)


def kl_threshold(hist: Any) -> int:
    """The bin (from 128 to 2047) ncnn2table clips a 2048-bin histogram at: the one whose
    clipped distribution loses the least KL divergence when quantized to 128 levels and
    expanded back.

    For threshold t, each of the 128 levels covers w = t/128 bins; a level's value is the
    mean density over its interval (fractional edge bins counted by their overlap), and
    expanding gives each bin the overlap-weighted levels it meets. Both distributions get
    1e-4 added per bin, the clipped one carries the mass beyond t in its last bin, and
    neither is renormalised: all as ncnn2table does.

    All 1920 thresholds at once, in O(128) per threshold rather than O(t): since w >= 1, a
    bin lies wholly inside one level (its expanded value is that level's) or straddles one
    level boundary (two levels, by overlap). So KL = sum c log c - sum c log e splits into
    prefix sums of c log c, per-level sums of c times log of the level, and one correction
    per boundary bin."""
    import numpy as np

    h = np.asarray(hist, dtype=np.float64)
    total = h.sum()
    if total <= 0:
        return BINS - 1
    h = h / total
    n = TARGET_BINS
    cum = np.concatenate([[0.0], np.cumsum(h)])  # mass of h below bin edge k
    c = h + _KL_EPS  # the clipped distribution, but for its last bin's tail
    cum_c = np.concatenate([[0.0], np.cumsum(c)])
    clogc = np.concatenate([[0.0], np.cumsum(c * np.log(c))])
    t = np.arange(n, BINS, dtype=np.int64)[:, None]  # (T, 1) thresholds
    j = np.arange(n + 1, dtype=np.int64)[None, :]  # (1, 129) level edges
    num = j * t  # level edge j sits at num / 128 bins (exact integers)
    whole, part = num // n, num % n
    edges = cum[whole] + (part / n) * h[np.minimum(whole, BINS - 1)]
    q = np.diff(edges, axis=1) * (n / t)  # (T, 128) the levels: mean density
    logq = np.log(q + _KL_EPS)
    tail = cum[-1] - cum[t[:, 0]]  # mass from bin t on, carried by bin t-1
    last_c = c[t[:, 0] - 1] + tail
    # sum c log c over the clipped distribution
    a = clogc[t[:, 0] - 1] + last_c * np.log(last_c)
    # bins wholly inside level j: [ceil(start_j), floor(end_j))
    lo = -(-num[:, :-1] // n)
    hi = num[:, 1:] // n
    inner = np.maximum(cum_c[hi] - cum_c[lo], 0.0)
    b = (inner * logq).sum(axis=1) + tail * logq[:, -1]  # bin t-1 lies inside level 127
    # a bin straddling the boundary between levels j-1 and j (j = 1..127)
    bnum, bpart = num[:, 1:-1], part[:, 1:-1]
    bin_ = bnum // n
    f = bpart / n  # the bin's share in level j-1
    e = _KL_EPS + f * q[:, :-1] + (1.0 - f) * q[:, 1:]
    cb = c[np.minimum(bin_, BINS - 1)]
    straddle = bpart > 0
    b = b + np.where(straddle, cb * np.log(np.where(straddle, e, 1.0)), 0.0).sum(axis=1)
    kl = a - b
    return int(t[int(np.argmin(kl)), 0])


@dataclass
class BlobStat:
    """What calibration gathers for one layer's input blob over the samples."""

    absmax: float = 0.0
    total: int = 0  # elements of one sample's blob (ACIQ's N, as ncnn2table counts it)
    hist: Any = None

    def threshold(self, method: str) -> float:
        """The clip threshold of the blob for ``method``."""
        if method == "minmax" or self.absmax == 0:
            return self.absmax
        if method == "aciq":
            return aciq_clip(self.absmax, max(self.total, 2))
        t = kl_threshold(self.hist)
        return (t + 0.5) * self.absmax / BINS


def blob_scale(stat: BlobStat, method: str) -> tuple[float, float]:
    """(threshold, scale = 127 / threshold) of a blob; 1.0 for a blob that was all zeros
    (ncnn2table divides by zero there; any scale quantizes zeros to zeros)."""
    thr = stat.threshold(method)
    return thr, (127.0 / thr if thr > 0 else 1.0)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"method={method!r} is not one of {METHODS}",
                         "kl (ncnn2table's default: the clip with the least KL divergence), "
                         "aciq (Gaussian clip, no histogram), minmax (no clipping)")


def quantizable(layers: Iterable[Any]) -> list[Any]:
    """The layers ncnn quantizes to int8: Convolution, ConvolutionDepthWise and
    InnerProduct with their weights in the .bin (not a dynamic weight), and every Gemm not
    int8 already (ncnn2int8's ``quantize_gemm`` quantizes each one: its constant weights
    from their own absmax, its inputs at run time; no table line), and every
    MultiHeadAttention not int8 already (weight scales only, its inputs at run time)."""
    out = []
    for layer in layers:
        if layer.type in ("Gemm", "MultiHeadAttention"):
            if not _int(layer, 18):
                out.append(layer)
            continue
        if layer.type not in QUANTIZABLE:
            continue
        if layer.type != "InnerProduct" and _int(layer, 19):
            continue  # dynamic weight: a bottom blob, nothing stored to quantize
        out.append(layer)
    return out


def calibrated(layers: Iterable[Any]) -> list[Any]:
    """The quantizable layers whose input a calibration table scales (not a Gemm or a
    MultiHeadAttention)."""
    return [la for la in quantizable(layers) if la.type in QUANTIZABLE]


def quantizable_or_refuse(param: Any, name: str, hint: str) -> list[Any]:
    """``quantizable(param.layers)``, or an InputError naming the model and its layer types
    when there is none."""
    layers = quantizable(param.layers)
    if not layers:
        kinds = sorted({la.type for la in param.layers})
        raise InputError(f"model {name} has no layer ncnn quantizes to int8 (Convolution, "
                         f"ConvolutionDepthWise, InnerProduct, Gemm); its layers are "
                         f"{', '.join(kinds)}", hint)
    return layers


# -- calibration -----------------------------------------------------------------------------


@dataclass
class FloatWeights:
    """The fp32 weights of one quantizable layer, read from the model's .bin."""

    layer: Any  # NcnnLayer
    values: Any  # float32 array, in the .bin's order


def model_weights(param: Any, bin_path: Path, layers: list[Any]) -> dict[str, FloatWeights]:
    """The fp32 weights of ``layers`` from ``bin_path``, placed by walking the .bin
    (``workbench.ncnn_bin``). Raises InputError for weights stored in fp16 or int8 (a
    model converted with fp16=True, or quantized already): int8 is made from fp32."""
    import numpy as np

    from ..ncnn_bin import walk_bin

    layout = walk_bin(param, bin_path)
    if layout.problem is not None:
        raise ModelFileError(f"{bin_path.name} does not fit {param.path.name}: "
                             f"{layout.problem}", "keep the .param and .bin of one conversion "
                             "together (convert again with wb.to_ncnn)")
    found = {b.layer: b for b in layout.blobs if b.role == "weight"}
    out = {}
    for layer in layers:
        blob = found.get(layer.name)
        if blob is None:
            where = (f"after a {layout.unknown[0]} layer, whose weights this module cannot "
                     "size" if layout.unknown else "in the .bin")
            raise InputError(f"the weights of {layer.name} ({layer.type}) cannot be placed "
                             f"{where} in {bin_path.name}",
                             f"keep {layer.name} in float (keep_float=[{layer.name!r}]), or "
                             "report the layer type so its layout is added to ncnn_bin.py")
        if blob.storage != "float32":
            raise InputError(
                f"model {param.path.name}: layer {layer.name} ({layer.type}) stores its "
                f"weights as {blob.storage}, expected float32 for int8 quantization",
                "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default); an fp16 "
                "model has lost precision already, an int8 one is quantized")
        values = np.fromfile(bin_path, dtype=np.float32, count=blob.count, offset=blob.offset)
        out[layer.name] = FloatWeights(layer, values)
    return out


def _threads(wanted: int) -> int:
    """ncnn's threads for the calibration runs: ``wanted``, or 1 when every core is busy
    already (load average >= cores). ncnn's OpenMP threads wait for each other at every
    layer, and on an oversubscribed machine that wait dominates: ResNet-50 ran at 6.0 s a
    run with 2 threads against 1.13 s with 1 (load 8 on 2 cores)."""
    import os

    try:
        busy = os.getloadavg()[0] >= (os.cpu_count() or 1)
    except OSError:
        busy = False
    return 1 if busy else wanted


def calibration_table(model: Any, samples: Iterable[Any], method: str = "kl", *,
                      num_threads: int = 2, isolated: bool = True, cache_mb: float = 256,
                      progress: bool = True) -> Int8Table:
    """Calibrate an fp32 ncnn model for int8, as ncnn2table does.

    Args:
        model: the ncnn Artifact (wb.to_ncnn), its .ncnn.param path, or an NcnnRunner.
        samples: model inputs, each as ``NcnnRunner.run`` takes them (a tuple of arrays in
            the model's input order and layout, a dict by input name, or one array).
        method: "kl" (ncnn2table's default), "aciq" or "minmax".
        num_threads: ncnn's threads for the calibration runs.
        isolated: run the first sample in the crash-isolating worker (the rest run in this
            process once it passed; ncnn2table runs in one process too).
        cache_mb: KL reads every blob twice (absmax, then the histogram on it); blobs up to
            this many MB are kept from the first pass, the rest are computed again.
        progress: show a progress bar.

    Returns:
        The Int8Table: weight scales and input-blob scales of every Convolution,
        ConvolutionDepthWise and InnerProduct layer (none for a Gemm, as ncnn2table
        writes none: an int8 Gemm scales its input at run time; a model whose only
        quantizable layers are Gemms gets a table with no lines); ``thresholds`` holds
        each input blob's (absmax, threshold).
    """
    import numpy as np
    from tqdm.auto import tqdm

    from ..params import parse_ncnn_param
    from ..runtime.ncnn_runner import NcnnRunner

    check_method(method)
    runner = model if isinstance(model, NcnnRunner) else NcnnRunner(
        model, precision="fp32", num_threads=num_threads, isolated=isolated)
    if runner.precision != "fp32":
        raise InputError(f"calibration runner for {runner.param.name} runs in "
                         f"{runner.precision}, expected fp32",
                         "calibrate on the fp32 activations: NcnnRunner(model) (the default "
                         "precision) or pass the model itself")
    param = parse_ncnn_param(runner.param)
    quantizable_or_refuse(param, runner.param.name,
                          "int8 in ncnn covers convolutions, fully connected layers and "
                          "Gemm: a model without them gains nothing; a MatMul stays float")
    layers = calibrated(param.layers)  # a Gemm needs no line: its input scales at run time
    weights = model_weights(param, runner.bin, layers)
    samples = list(samples)
    if not samples:
        raise InputError("calibration samples: got none, expected at least one input of "
                         f"{runner.param.name}", "pass a list of inputs (tuples of arrays in "
                         "the model's input order), e.g. 32 to 64 samples like real data")
    mha = mha_scales(param, runner.bin)
    if not layers:
        table = Int8Table(method=method, samples=len(samples))
        _add_mha(table, mha)
        return table
    bottoms = list(dict.fromkeys(la.bottoms[0] for la in layers))
    stats = {b: BlobStat() for b in bottoms}
    cache: dict[int, dict[str, Any]] = {}
    budget = cache_mb * 2**20 if method == "kl" else 0

    def run(i: int, sample: Any) -> dict[str, Any]:
        try:
            feed = runner.feed(sample)
        except InputError as e:
            raise InputError(f"calibration sample {i} (of {len(samples)}): {e.message}",
                             e.hint) from e
        for name, arr in feed.items():
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise InputError(f"calibration sample {i} (of {len(samples)}): input "
                                 f"{name!r} holds NaN or Inf",
                                 "calibration needs finite inputs like the real data; drop "
                                 "or fix that sample")
        return local[0].run_blobs(feed, bottoms)

    local = [runner]
    for i, sample in enumerate(tqdm(samples, desc="int8 calibration: absmax",
                                    disable=not progress)):
        blobs = run(i, sample)
        if i == 0 and runner.isolated:
            # the first sample ran in the crash-isolating worker; the rest run in this
            # process: the worker moves every blob read by a conv through a pipe (ResNet-50:
            # 43 MB a sample, 1.5 s a run against 0.075 s in-process)
            local[0] = NcnnRunner(runner.param, precision="fp32",
                                  num_threads=_threads(runner.num_threads), isolated=False,
                                  check_sizes=runner.check_sizes)
        for b in bottoms:
            arr = np.asarray(blobs[b], dtype=np.float32)
            absmax = float(np.abs(arr).max()) if arr.size else 0.0
            if not math.isfinite(absmax):
                layer = next(la.name for la in layers if la.bottoms[0] == b)
                raise InputError(f"calibration sample {i}: blob {b!r} (read by {layer}) holds "
                                 "NaN or Inf in the fp32 model",
                                 "the fp32 model overflows on this sample: check the sample's "
                                 "range and preprocessing")
            st = stats[b]
            st.absmax, st.total = max(st.absmax, absmax), arr.size
        size = sum(np.asarray(blobs[b]).nbytes for b in bottoms)
        if size <= budget:
            cache[i] = {b: np.array(blobs[b], dtype=np.float32) for b in bottoms}
            budget -= size
    if method == "kl":
        for st in stats.values():
            st.hist = np.zeros(BINS, dtype=np.int64)
        for i, sample in enumerate(tqdm(samples, desc="int8 calibration: histogram",
                                        disable=not progress)):
            blobs = cache.pop(i, None) or run(i, sample)
            for b in bottoms:
                if stats[b].absmax > 0:
                    stats[b].hist += histogram(blobs[b], stats[b].absmax)
    table = Int8Table(method=method, samples=len(samples))
    for la in layers:
        table.weight_scales[la.name] = weight_scales(la, weights[la.name].values, method)
    _add_mha(table, mha)
    thresholds = {b: blob_scale(stats[b], method) for b in bottoms}  # KL: ~20 ms a blob
    for la in layers:
        thr, scale = thresholds[la.bottoms[0]]
        table.blob_scales[la.name] = np.array([scale], dtype=np.float32)
        table.thresholds[la.name] = (stats[la.bottoms[0]].absmax, thr)
    return table


def _add_mha(table: Int8Table, mha: dict[str, list[Any]]) -> None:
    for name, (q, *more) in mha.items():
        table.weight_scales[name] = q
        table.more_weight_scales[name] = more


def mha_weights(param: Any, bin_path: Path, layer: Any) -> dict[str, Any]:
    """{q_weight, k_weight, v_weight, out_weight: fp32 array} of a MultiHeadAttention."""
    import numpy as np

    from ..ncnn_bin import walk_bin

    blobs = {b.role: b for b in walk_bin(param, bin_path).blobs if b.layer == layer.name}
    roles = ("q_weight", "k_weight", "v_weight", "out_weight")
    if not all(r in blobs for r in roles):
        raise InputError(f"the weights of {layer.name} (MultiHeadAttention) cannot be placed "
                         f"in {bin_path.name}", f"keep {layer.name} in float "
                         f"(keep_float=[{layer.name!r}])")
    if any(blobs[r].storage != "float32" for r in roles):
        raise InputError(f"model {param.path.name}: layer {layer.name} (MultiHeadAttention) "
                         "does not store its weights as float32",
                         "quantize the fp32 model: wb.to_ncnn(..., fp16=False) (the default)")
    return {r: np.fromfile(bin_path, dtype=np.float32, count=blobs[r].count,
                           offset=blobs[r].offset) for r in roles}


def mha_scales(param: Any, bin_path: Path) -> dict[str, list[Any]]:
    """{MultiHeadAttention: [q, k, v, out] weight scales} as ncnn2table computes them:
    127 / absmax of each of embed_dim rows of the q, k and v weights, one for all of out."""

    out = {}
    for la in quantizable(param.layers):
        if la.type != "MultiHeadAttention":
            continue
        w = mha_weights(param, bin_path, la)
        e = _int(la, 0)
        out[la.name] = [absmax_scales(w[role].reshape(e, -1))
                        for role in ("q_weight", "k_weight", "v_weight")] + [
            absmax_scales(w["out_weight"].reshape(1, -1), per_row=False)]
    return out
