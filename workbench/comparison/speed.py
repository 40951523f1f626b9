"""Speed beside accuracy: each precision's plain-run latency and its final-output error, for
ONNX Runtime and ncnn side by side in one run (issue 18 item 4).

``wb.precision_table(model, [onx, q8, nc, nc_int8, NcnnRunner(nc, precision="fp16")], (x,))``
runs every candidate on the same inputs: once through its crash-isolated worker for the
accuracy (final-output SNR and max abs against the PyTorch reference), then timed in this
process, ``capture="outputs"``, every backend with the same thread count. The timed runs are
interleaved (each round runs every candidate once, the order rotating), so machine load hits
all alike; each latency is a median. A row's ``speedup`` is the fp32 candidate of the same
backend's median over its own: "ncnn int8: 2.1x faster, -0.8 dB vs ncnn fp32".

With ``task=`` (a task metric, task.py), each row also scores the candidate's answers over the
evaluation set, run through its crash-isolated runner: "ncnn int8: 1.9x faster, -3.1 dB vs
ncnn fp32, top-1 agrees on 47/50".

Timed in this process, not in the worker: the worker's transfer of inputs and outputs adds a
constant that blurs the ratios of a small model. The isolated run goes first, so a model
that crashes its backend is reported (BackendCrashed) before anything runs here.
"""

from __future__ import annotations

import html
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    from .task import TaskScore

# emulated storage is ncnn's fp32 kernels run layer by layer from Python: no speed figure
EMULATED_NOTE = "storage emulated layer by layer from Python: its latency is no device figure"


@dataclass
class PrecisionRow:
    """One candidate: ``latency_ms`` the median plain run (None: not timed, see ``note``);
    ``speedup`` the fp32 candidate of the same backend's median over this one's (> 1:
    faster; None without an fp32 candidate); ``snr_db`` the final outputs' SNR against the
    PyTorch reference (the worst output; inf: equal); ``snr_delta_db`` that minus the same
    backend's fp32 SNR; ``max_abs`` the largest absolute difference of any output; ``task``
    the task metric's score (None: no task given)."""

    label: str
    backend: str  # "onnxruntime" | "ncnn"
    precision: str  # "fp32", "fp16", "bf16", "int8", "fp16 emulated (arm-fp16)", ...
    latency_ms: float | None
    speedup: float | None
    snr_db: float
    snr_delta_db: float | None
    max_abs: float
    runs: int = 0
    note: str = ""
    task: TaskScore | None = None


@dataclass
class PrecisionTable:
    """The rows in the order the candidates were given, and how they were measured."""

    rows: list[PrecisionRow]
    threads: int
    repeat: int
    warmup: int
    load_average: tuple[float, float] = (math.nan, math.nan)  # 1-min, at start and end
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def row(self, label: str) -> PrecisionRow:
        """The row labelled ``label``."""
        for r in self.rows:
            if r.label == label:
                return r
        raise InputError(f"no row labelled {label!r}",
                         f"labels: {[r.label for r in self.rows]}")

    def summary(self) -> str:
        """One line a candidate: "ncnn int8: 2.1x faster, -0.8 dB vs ncnn fp32", and its
        task score when a task was given: ", top-1 agrees on 47/50"."""
        head = (f"{len(self.rows)} candidates, {self.threads} thread(s) each, median of "
                f"{self.repeat} interleaved runs; load average {self.load_average[0]:.2f} -> "
                f"{self.load_average[1]:.2f}")
        return "\n".join([head, *(_line(r, self._fp32(r)) for r in self.rows), *self.notes])

    def _fp32(self, row: PrecisionRow) -> PrecisionRow | None:
        return next((r for r in self.rows if r.backend == row.backend
                     and r.precision == "fp32"), None)

    def table(self) -> list[list[str]]:
        """The rows as text, a header first; a last column, named for the task, when a task
        metric was given."""
        task = next((r.task.task for r in self.rows if r.task is not None), None)
        out = [["candidate", "backend", "precision", "median ms", "speed-up", "SNR dB",
                "dB vs fp32", "max abs", *([task] if task else [])]]
        for r in self.rows:
            out.append([r.label, r.backend, r.precision, _num(r.latency_ms, "{:.3f}"),
                        _num(r.speedup, "{:.2f}x"), _num(r.snr_db, "{:.1f}"),
                        _num(r.snr_delta_db, "{:+.1f}"), f"{r.max_abs:.3g}",
                        *([r.task.cell if r.task else "-"] if task else [])])
        return out

    def __str__(self) -> str:
        rows = self.table()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]
        return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:],
                          self.summary().split("\n", 1)[0]])

    def _repr_html_(self) -> str:
        rows = self.table()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in rows[1:])
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        summary = html.escape(self.summary().split("\n", 1)[0])
        return (f"<div><p>{summary}</p><table><thead><tr>{head}</tr></thead><tbody>{body}"
                f"</tbody></table>" + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


def _num(v: float | None, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return fmt.format(v)


def _line(r: PrecisionRow, fp32: PrecisionRow | None) -> str:
    if r.latency_ms is None:
        speed = "not timed"
    elif fp32 is None or r is fp32 or r.speedup is None:
        speed = f"{r.latency_ms:.2f} ms"
    elif abs(r.speedup - 1) < 0.05:
        speed = f"as fast ({r.speedup:.2f}x)"
    elif r.speedup >= 1:
        speed = f"{r.speedup:.1f}x faster"
    else:
        speed = f"{1 / r.speedup:.1f}x slower"
    if fp32 is None or r is fp32 or r.snr_delta_db is None:
        acc = f"{_num(r.snr_db, '{:.1f}')} dB vs torch"
    elif math.isnan(r.snr_delta_db):  # both inf: equal to fp32 and to torch
        acc = f"{_num(r.snr_db, '{:.1f}')} dB vs torch, as {fp32.label}"
    else:
        acc = f"{r.snr_delta_db:+.1f} dB vs {fp32.label}"
    if r.task is not None:
        acc += f", {r.task.text}"
    return f"{r.label}: {speed}, {acc}" + (f" ({r.note})" if r.note else "")


@dataclass
class _Entry:
    """A candidate as measured here: its label, a crash-isolated runner for the accuracy run
    and an in-process one for timing (None: not timed)."""

    label: str
    backend: str
    precision: str
    checked: Any
    timed: Any
    note: str = ""


def precision_table(reference: Any, candidates: Sequence[Any] | Mapping[str, Any],
                    inputs: Any, *, repeat: int = 20, warmup: int = 3, threads: int = 1,
                    progress: bool = True, task: Any = None) -> PrecisionTable:
    """Latency and final-output accuracy of each candidate precision, side by side.

    Args:
        reference: the PyTorch model (nn.Module) the candidates were made from.
        candidates: ONNX or ncnn artifacts or paths (fp32, or int8 from ``wb.quantize``), or
            runners (``NcnnRunner(nc, precision="fp16")``, ``NcnnRunner(nc, precision="fp16",
            emulate="arm-fp16")``); a mapping {label: candidate} names the rows.
        inputs: the model inputs (a tuple of tensors, or one tensor).
        repeat: timed runs per candidate (the median is reported).
        warmup: untimed runs per candidate before.
        threads: intra-op threads of every backend (the same for all, so ratios compare).
        progress: a progress bar over the rounds.
        task: a task metric (``wb.TopK(1)``, ``wb.PitchCents()``... see task.py) scored for
            every candidate over its ``data`` (default: ``inputs``), with the candidate's
            crash-isolated runner: each row's ``task``, a column of ``table()``.

    Returns:
        PrecisionTable: ``rows``, ``summary()``, ``table()``; shown as HTML in a notebook.

    Raises:
        InputError: a reference that is no nn.Module, bad counts, no candidates, a
            candidate that is not a conversion of the reference; a task that is none, or an
            evaluation set or output that does not fit it.
    """
    import numpy as np
    import torch

    from ..runtime import TorchRunner
    from .task import check_task, evaluation_set

    t0 = time.perf_counter()
    named = _checked(reference, candidates, repeat, warmup, threads)
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    args = tuple(a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
                 for a in args)
    task_set = None if task is None else evaluation_set(check_task(task), args)
    ref = TorchRunner(reference).run(tuple(a.clone() for a in args))
    ref_values = [np.asarray(v) for v in ref.values()]
    feed = tuple(a.numpy() for a in args)  # every backend fed the same numpy arrays
    entries = [_entry(thing, label, i, threads) for i, (label, thing) in enumerate(named)]
    _unique_labels(entries)
    accuracy = _accuracy(entries, feed, ref_values, progress)
    scores = {} if task is None else _task_scores(task, reference, entries, task_set)
    load_start = os.getloadavg()[0]
    times = _interleaved([e for e in entries if e.timed is not None], feed, repeat, warmup,
                         progress)
    load_end = os.getloadavg()[0]
    rows = []
    for e, acc in zip(entries, accuracy, strict=True):
        t = times.get(e.label)
        rows.append(PrecisionRow(e.label, e.backend, e.precision,
                                 statistics.median(t) * 1e3 if t else None, None, acc.snr_db,
                                 None, acc.max_abs, len(t) if t else 0, e.note,
                                 scores.get(e.label)))
    _against_fp32(rows)
    _note_bit_identical(rows, [acc.outputs for acc in accuracy])
    notes = [f"no fp32 {backend} candidate: its rows have no speed-up or dB delta (add the "
             "fp32 model to compare against)" for backend in dict.fromkeys(r.backend for r in rows)
             if not any(r.backend == backend and r.precision == "fp32" for r in rows)]
    return PrecisionTable(rows, threads, repeat, warmup, (load_start, load_end),
                          time.perf_counter() - t0, notes)


def _checked(reference: Any, candidates: Sequence[Any] | Mapping[str, Any], repeat: int,
             warmup: int, threads: int) -> list[tuple[str | None, Any]]:
    """precision_table's arguments checked: the candidates as (label or None, candidate)."""
    import torch

    if not isinstance(reference, torch.nn.Module):
        raise InputError(f"precision_table's reference is a {type(reference).__name__}, not "
                         "an nn.Module", "pass the PyTorch model the candidates were made "
                         "from: wb.precision_table(model, [onx, q8], (x,))")
    for name, v, least in (("repeat", repeat, 1), ("warmup", warmup, 0),
                           ("threads", threads, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise InputError(f"{name}={v!r} is not an integer >= {least}",
                             "e.g. repeat=20, warmup=3, threads=1")
    named = (list(candidates.items()) if isinstance(candidates, Mapping)
             else [(None, c) for c in (candidates or ())])
    if not named:
        raise InputError("precision_table got no candidates",
                         "pass the models to time, e.g. [onx, wb.quantize(onx, samples), nc, "
                         "wb.quantize(nc, samples)]")
    return named


@dataclass
class _Accuracy:
    """A candidate's final outputs against the reference's: the worst output's SNR, the
    largest absolute difference of any, and the outputs (to tell bit-identical runs)."""

    snr_db: float
    max_abs: float
    outputs: list[Any]


def _accuracy(entries: list[_Entry], feed: tuple, ref_values: list[Any],
              progress: bool) -> list[_Accuracy]:
    """Each entry's outputs on ``feed`` by its crash-isolated runner, against the
    reference's."""
    import numpy as np
    from tqdm.auto import tqdm

    from ..precision.snr import snr_db

    out = []
    for i, e in enumerate(tqdm(entries, desc="accuracy", disable=not progress, leave=False)):
        got = _run_checked(e, i, feed, ref_values)
        snr = min(snr_db(r, g) for r, g in zip(ref_values, got, strict=True))
        worst = max(float(np.max(np.abs(np.asarray(r, np.float64).reshape(-1)
                                        - np.asarray(g, np.float64).reshape(-1))))
                    for r, g in zip(ref_values, got, strict=True))
        out.append(_Accuracy(snr, worst, got))
    return out


def _task_scores(task: Any, reference: Any, entries: list[_Entry], task_set: Any
                 ) -> dict[str, TaskScore]:
    """The answers, by the crash-isolated runners (not the timed ones); an entry whose
    evaluation run failed gets a note saying so."""
    from ..runtime import TorchRunner
    from .task import evaluate_candidates

    scores, not_run = evaluate_candidates(task, TorchRunner(reference),
                                          [(e.label, e.checked) for e in entries], task_set)
    for e in entries:
        e.note = "; ".join(filter(None, [e.note, not_run.get(e.label)]))
    return scores


def _against_fp32(rows: list[PrecisionRow]) -> None:
    """Each row's speed-up and dB delta against its backend's fp32 row (when there is one)."""
    for r in rows:
        fp32 = next((f for f in rows if f.backend == r.backend and f.precision == "fp32"),
                    None)
        if fp32 is None:
            continue
        if fp32.latency_ms and r.latency_ms:
            r.speedup = fp32.latency_ms / r.latency_ms
        r.snr_delta_db = (math.nan if math.isinf(r.snr_db) and math.isinf(fp32.snr_db)
                          else r.snr_db - fp32.snr_db)


def _note_bit_identical(rows: list[PrecisionRow], outputs: list[list[Any]]) -> None:
    """A note on each row whose outputs are bit-identical to its backend's fp32 row's: no
    layer ran in its precision here."""
    import numpy as np

    for r, got in zip(rows, outputs, strict=True):
        base = next((k for k, f in enumerate(rows) if f.backend == r.backend
                     and f.precision == "fp32"), None)
        if base is not None and rows[base] is not r and all(
                np.array_equal(a, b) for a, b in zip(got, outputs[base], strict=True)):
            r.note = "; ".join(filter(None, [r.note, f"outputs bit-identical to "
                                              f"{rows[base].label}: no layer ran in "
                                              f"{r.precision} here"]))


def _entry(thing: Any, label: str | None, index: int, threads: int) -> _Entry:
    """The two runners of a candidate, with ``threads`` whatever a given runner had."""
    from ..runtime import NcnnRunner, OrtRunner, Runner

    if isinstance(thing, OrtRunner):
        path, libraries, params = thing.path, thing.libraries, {}
    elif isinstance(thing, NcnnRunner):
        path, libraries, params = thing.param, (), {}
    elif isinstance(thing, Runner):
        raise InputError(f"candidate {index} is a {type(thing).__name__}; precision_table "
                         "times ONNX Runtime and ncnn", "pass ONNX or ncnn artifacts, paths, "
                         "or their OrtRunner / NcnnRunner")
    else:
        path = Path(getattr(thing, "path", thing)) if isinstance(
            getattr(thing, "path", thing), (str, os.PathLike)) else None
        if path is None:
            raise InputError(f"candidate {index} is a {type(thing).__name__}",
                             "pass ONNX or ncnn artifacts (wb.export, wb.to_ncnn, "
                             "wb.quantize), their paths, or an OrtRunner / NcnnRunner")
        libraries = ()
        params = getattr(thing, "params", None) or {}
    try:
        if isinstance(thing, OrtRunner) or (not isinstance(thing, Runner)
                                            and str(path).endswith(".onnx")):
            precision, detail = _ort_precision(path, params)
            checked = OrtRunner(path, libraries=libraries, num_threads=threads)
            timed = OrtRunner(path, libraries=libraries, num_threads=threads, isolated=False)
            label = label or f"onnxruntime {precision}" + (f" ({detail})" if detail else "")
            return _Entry(label, "onnxruntime", precision, checked, timed)
        if isinstance(thing, NcnnRunner) or str(path).endswith(".ncnn.param"):
            native = thing.precision if isinstance(thing, NcnnRunner) else "fp32"
            emulate = thing.emulate if isinstance(thing, NcnnRunner) else None
            int8 = params.get("precision") == "int8" or _ncnn_int8(path)
            precision = ("int8" if int8 else native if emulate is None
                         else f"{native} emulated ({emulate})")
            kw = {"precision": native, "num_threads": threads, "emulate": emulate}
            checked = NcnnRunner(path, **kw)
            timed = None if emulate else NcnnRunner(path, isolated=False, **kw)
            return _Entry(label or f"ncnn {precision}", "ncnn", precision, checked, timed,
                          EMULATED_NOTE if emulate else "")
    except InputError as e:
        raise InputError(f"candidate {index} ({path}): {e.message}", e.hint) from None
    raise InputError(f"candidate {index} ({path}) is neither ONNX (.onnx) nor ncnn "
                     "(.ncnn.param)", "pass the artifacts of wb.export / wb.to_ncnn / "
                     "wb.quantize or their paths")


def _ort_precision(path: Path, params: Mapping[str, Any]) -> tuple[str, str]:
    """("int8", "QDQ" | "dynamic") for a quantized ONNX model, else ("fp32", "")."""
    if params.get("precision") == "int8":
        return "int8", str(params.get("format") or "")
    from ..graph import summarize

    ops = summarize(path).op_histogram
    if ops.get("DynamicQuantizeLinear") or ops.get("MatMulInteger"):
        return "int8", "dynamic"
    if ops.get("QuantizeLinear") or ops.get("QLinearConv"):
        return "int8", "QDQ"
    return "fp32", ""


def _ncnn_int8(param: Path) -> bool:
    """Whether any layer of an ncnn model holds int8 weights (``8=`` int8_scale_term)."""
    from ..params import parse_ncnn_param

    return any(str(ly.params.get(8, "0")) not in ("0", "")
               for ly in parse_ncnn_param(param).layers
               if ly.type in ("Convolution", "ConvolutionDepthWise", "InnerProduct"))


def _unique_labels(entries: list[_Entry]) -> None:
    """Two candidates of the same kind get #2, #3... so every row is named once."""
    seen: dict[str, int] = {}
    for e in entries:
        seen[e.label] = seen.get(e.label, 0) + 1
        if seen[e.label] > 1:
            e.label = f"{e.label} #{seen[e.label]}"


def _run_checked(e: _Entry, index: int, feed: tuple, ref_values: list[Any]) -> list[Any]:
    """The candidate's outputs on ``feed`` (crash-isolated), in order; a candidate whose
    inputs or outputs are not the reference's is an InputError naming it."""
    import numpy as np

    hint = ("every candidate must be converted from the reference model: wb.export(model, "
            "(x,)), wb.to_ncnn(model, (x,)), wb.quantize(...) of those")
    try:
        got = list(e.checked.run(feed).values())
    except InputError as err:
        raise InputError(f"candidate {index} ({e.label}) does not take the reference's "
                         f"inputs: {err.message}", hint) from None
    if len(got) != len(ref_values) or any(
            np.size(g) != np.size(r) for g, r in zip(got, ref_values, strict=True)):
        raise InputError(
            f"candidate {index} ({e.label}) is not a conversion of the reference model: it "
            f"returns {[tuple(np.shape(g)) for g in got]}, the reference "
            f"{[tuple(np.shape(r)) for r in ref_values]}", hint)
    return got


def _interleaved(entries: list[_Entry], feed: tuple, repeat: int, warmup: int,
                 progress: bool) -> dict[str, list[float]]:
    """Seconds per plain run of each entry's in-process runner. Each round runs every entry
    once, the order rotated a step each round, so load that comes and goes hits all alike
    (bench/_common.py's round robin; bench/ is not importable from the engine)."""
    from tqdm.auto import tqdm

    times: dict[str, list[float]] = {e.label: [] for e in entries}
    if not entries:
        return times
    for r in tqdm(range(warmup + repeat), desc="timing", disable=not progress, leave=False):
        shift = r % len(entries)
        for e in entries[shift:] + entries[:shift]:
            t0 = time.perf_counter()
            e.timed.run(feed, capture="outputs")
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[e.label].append(dt)
    return times


__all__ = ["precision_table", "PrecisionTable", "PrecisionRow"]
