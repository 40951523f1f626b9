"""Calibrating an fp32 ncnn model for int8, as ncnn's ``ncnn2table`` does.

The ncnn wheel ships neither ``ncnn2table`` nor ``ncnn2int8``, so the table is made here: the
fp32 model runs on the calibration samples (``NcnnRunner``), the blob every Convolution,
ConvolutionDepthWise and InnerProduct layer reads is measured (its absmax in a first pass,
for ``kl`` its histogram in a second), and the table (``int8_table``) gets each layer's
weight scales (``weight_scales``) and its input's scale, 127 over the clip threshold the
method finds (``thresholds``). A MultiHeadAttention gets its weight scales only; a Gemm no
line (its input scales at run time).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import InputError
from ..params import parse_ncnn_param
from ..runtime.ncnn_runner import NcnnRunner
from .float_weights import model_weights
from .int8_table import Int8Table
from .quantizable import calibrated, quantizable_or_refuse
from .thresholds import BINS, BlobStat, blob_scale, check_method, histogram
from .weight_scales import mha_scales, weight_scales


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
    check_method(method)
    runner = _fp32_runner(model, num_threads, isolated)
    param = parse_ncnn_param(runner.param)
    quantizable_or_refuse(param, runner.param.name,
                          "int8 in ncnn covers convolutions, fully connected layers and "
                          "Gemm: a model without them gains nothing; a MatMul stays float")
    layers = calibrated(param.layers)  # a Gemm needs no line: its input scales at run time
    weights = model_weights(param, runner.bin, layers)
    samples = _some(samples, runner.param.name)
    mha = mha_scales(param, runner.bin)
    table = Int8Table(method=method, samples=len(samples))
    if not layers:
        _add_mha(table, mha)
        return table
    stats = _blob_stats(runner, samples, layers, method, cache_mb, progress)
    for la in layers:
        table.weight_scales[la.name] = weight_scales(la, weights[la.name].values, method)
    _add_mha(table, mha)
    thresholds = {b: blob_scale(st, method) for b, st in stats.items()}  # KL: ~20 ms a blob
    for la in layers:
        thr, scale = thresholds[la.bottoms[0]]
        table.blob_scales[la.name] = np.array([scale], dtype=np.float32)
        table.thresholds[la.name] = (stats[la.bottoms[0]].absmax, thr)
    return table


def _fp32_runner(model: Any, num_threads: int, isolated: bool) -> Any:
    """The NcnnRunner given, or one made for the model; refused unless it runs in fp32."""
    runner = model if isinstance(model, NcnnRunner) else NcnnRunner(
        model, precision="fp32", num_threads=num_threads, isolated=isolated)
    if runner.precision != "fp32":
        raise InputError(f"calibration runner for {runner.param.name} runs in "
                         f"{runner.precision}, expected fp32",
                         "calibrate on the fp32 activations: NcnnRunner(model) (the default "
                         "precision) or pass the model itself")
    return runner


def _some(samples: Iterable[Any], model: str) -> list[Any]:
    samples = list(samples)
    if not samples:
        raise InputError("calibration samples: got none, expected at least one input of "
                         f"{model}", "pass a list of inputs (tuples of arrays in "
                         "the model's input order), e.g. 32 to 64 samples like real data")
    return samples


def _add_mha(table: Int8Table, mha: dict[str, list[Any]]) -> None:
    for name, (q, *more) in mha.items():
        table.weight_scales[name] = q
        table.more_weight_scales[name] = more


def _threads(wanted: int) -> int:
    """ncnn's threads for the calibration runs: ``wanted``, or 1 when every core is busy
    already (load average >= cores). ncnn's OpenMP threads wait for each other at every
    layer, and on an oversubscribed machine that wait dominates: ResNet-50 ran at 6.0 s a
    run with 2 threads against 1.13 s with 1 (load 8 on 2 cores)."""
    try:
        busy = os.getloadavg()[0] >= (os.cpu_count() or 1)
    except OSError:
        busy = False
    return 1 if busy else wanted


class _BlobReader:
    """Runs one sample and returns the blobs the calibrated layers read: the first sample in
    the runner given (the crash-isolating worker when isolated), the rest in this process."""

    def __init__(self, runner: Any, bottoms: list[str], count: int) -> None:
        self.runner, self.bottoms, self.count = runner, bottoms, count
        self.local = runner

    def __call__(self, i: int, sample: Any) -> dict[str, Any]:
        try:
            feed = self.runner.feed(sample)
        except InputError as e:
            raise InputError(f"calibration sample {i} (of {self.count}): {e.message}",
                             e.hint) from e
        for name, arr in feed.items():
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise InputError(f"calibration sample {i} (of {self.count}): input "
                                 f"{name!r} holds NaN or Inf",
                                 "calibration needs finite inputs like the real data; drop "
                                 "or fix that sample")
        return self.local.run_blobs(feed, self.bottoms)

    def in_process(self) -> None:
        """After the first sample passed in the worker: the worker moves every blob read by a
        conv through a pipe (ResNet-50: 43 MB a sample, 1.5 s a run against 0.075 s
        in-process)."""
        r = self.runner
        if r.isolated:
            self.local = NcnnRunner(r.param, precision="fp32", num_threads=_threads(r.num_threads),
                                    isolated=False, check_sizes=r.check_sizes)


def _blob_stats(runner: Any, samples: list[Any], layers: list[Any], method: str,
                cache_mb: float, progress: bool) -> dict[str, BlobStat]:
    """{blob: its BlobStat} of every blob a calibrated layer reads, over ``samples``: the
    absmax pass, then for KL the histogram pass (on the blobs the first pass kept, or run
    again)."""
    bottoms = list(dict.fromkeys(la.bottoms[0] for la in layers))
    reader = _BlobReader(runner, bottoms, len(samples))
    stats = {b: BlobStat() for b in bottoms}
    budget = cache_mb * 2**20 if method == "kl" else 0
    cache = _absmax_pass(reader, samples, layers, stats, budget, progress)
    if method == "kl":
        _histogram_pass(reader, samples, stats, cache, progress)
    return stats


def _absmax_pass(reader: _BlobReader, samples: list[Any], layers: list[Any],
                 stats: dict[str, BlobStat], budget: float,
                 progress: bool) -> dict[int, dict[str, Any]]:
    """Each blob's absmax over the samples (and its size, ACIQ's N) into ``stats``; returns
    the samples' blobs kept while they fit in ``budget`` bytes."""
    from tqdm.auto import tqdm

    cache: dict[int, dict[str, Any]] = {}
    for i, sample in enumerate(tqdm(samples, desc="int8 calibration: absmax",
                                    disable=not progress)):
        blobs = reader(i, sample)
        if i == 0:
            reader.in_process()
        for b in reader.bottoms:
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
        size = sum(np.asarray(blobs[b]).nbytes for b in reader.bottoms)
        if size <= budget:
            cache[i] = {b: np.array(blobs[b], dtype=np.float32) for b in reader.bottoms}
            budget -= size
    return cache


def _histogram_pass(reader: _BlobReader, samples: list[Any], stats: dict[str, BlobStat],
                    cache: dict[int, dict[str, Any]], progress: bool) -> None:
    """Each blob's 2048-bin histogram up to its absmax, summed over the samples."""
    from tqdm.auto import tqdm

    for st in stats.values():
        st.hist = np.zeros(BINS, dtype=np.int64)
    for i, sample in enumerate(tqdm(samples, desc="int8 calibration: histogram",
                                    disable=not progress)):
        blobs = cache.pop(i, None) or reader(i, sample)
        for b in reader.bottoms:
            if stats[b].absmax > 0:
                stats[b].hist += histogram(blobs[b], stats[b].absmax)
