"""The unpruned and the pruned model as a backend gets them: each exported to ONNX
(``wb.export``) and converted to ncnn (``wb.to_ncnn`` of that ONNX), their files weighed, and
both timed alternately in this process (each round runs every model, the order rotating, so
load that comes and goes hits all alike).

How, and why (measured on this project's 2-core KVM machine, shared with other work):

- With one thread (the default) a run is timed by its CPU time on the calling thread, where
  both backends run a one-thread model. A wall clock there is not the model's time: a run
  the scheduler preempts takes whole slices of another process more (2.2 ms runs took 6.2,
  10.3 or 14.3 ms while their CPU time stayed 2.2), and whether the median of 15 lands on
  preempted runs is a coin toss: two identical models came out 0.2x to 4.4x apart, and up
  to 2.8x apart in 18 trials at a load of 7-8.5. With more threads the work is on
  other threads too, so the wall clock is used; the report's spread and load tell how far
  to trust it.
- In each round a model runs TURN=4 times in a row and its fastest run counts: its first
  runs come after the other models evicted its caches (a zoo ResNet's ncnn net took 0.74,
  0.51, 0.46, 0.43 ms of CPU in a row after the other three ran; its ORT session 0.17 ms
  warm, 0.45-0.58 ms right after them), and interference (a preemption, a neighbour on the
  shared core, caches and memory, the host) only adds time.
- Interference also comes and goes in stretches of rounds, so the two models are compared
  round by round: the pruned model's latency is the unpruned one's (the median over the
  rounds) times the median of the rounds' ratios (the pruned model's fastest run over the
  unpruned one's in the same round, moments apart). Identical models at the defaults (15
  rounds), 54 trials of three models, two backends, at loads from 1 to 3 with and without
  a busy neighbour: within 7.6% of each other, where one wall-clock run a turn, its median
  over the rounds (the way it was timed before), was up to 23% and 144% (2.4x) off, and
  the fastest run of each model up to 13% (two instances of one model differ by up to 7%
  warm, once 31%: where their buffers landed in the caches). bench/prune_figures.py prints
  the check (``--timing-only``).
- Before the rounds each model runs untimed until its time settles: at least ``warmup``
  runs, then until its last three agree within 10% (a fresh session's or net's first runs
  fault in its buffers: ~2000 page faults in the first here, ~300 in ncnn's second). The
  garbage collector is off meanwhile, as in timeit.

The export and the conversion each check their output against torch (in the crash-isolating
worker), so a model that crashes its backend is stopped there, before anything runs here.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace
from ..errors import WorkbenchError
from .export import export
from .ncnn import to_ncnn
from .prune_report import BeforeAfter, Timing

BACKENDS = ("onnxruntime", "ncnn")
WALL, CPU = 0, 1  # indices into a run's (wall, cpu) seconds
SETTLE_RUNS, SETTLE_TOLERANCE, SETTLE_MAX = 3, 0.10, 20
TURN = 4  # runs of a model in a row in each round; its best counts
# a run preempted: its wall time past its CPU time by this much (0.1 ms, or 20%)
PREEMPTED_S, PREEMPTED_FRACTION = 1e-4, 0.2


@dataclass
class Measured:
    """The backend figures of one unpruned/pruned pair, by PruneReport field name."""

    figures: dict[str, BeforeAfter] = field(default_factory=dict)
    timing: Timing | None = None
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)


def measure_backends(base: Any, pruned: Any, inputs: tuple, backends: Sequence[str],
                     workspace: Workspace, *, threads: int, repeat: int, warmup: int,
                     export_options: Mapping[str, Any], step: Callable[[str], None]
                     ) -> Measured:
    """Export, convert, weigh and time ``base`` and ``pruned`` on ``inputs``.

    ``step(phase)`` is called as each of the export, conversion and timing steps starts.
    A stage that fails for either model is recorded in ``errors`` (keyed "onnx" / "ncnn")
    and its figures left out; ncnn needs the ONNX files."""
    out = Measured()
    models = {"": base, " pruned": pruned}
    try:
        for tag, model in models.items():
            step(f"export{tag}")
            out.artifacts[f"onnx{tag}"] = export(model, inputs, workspace=workspace,
                                                 **dict(export_options))
    except WorkbenchError as err:
        out.errors["onnx"] = err
        return out
    onnx = out.artifacts["onnx"], out.artifacts["onnx pruned"]
    out.figures["onnx_nodes"] = BeforeAfter(*(a.graph.node_count for a in onnx))
    out.figures["onnx_bytes"] = BeforeAfter(*(_bytes(a, ".onnx") for a in onnx))
    if "ncnn" in backends:
        try:
            for tag in models:
                step(f"ncnn{tag}")
                out.artifacts[f"ncnn{tag}"] = to_ncnn(out.artifacts[f"onnx{tag}"],
                                                      workspace=workspace)
            out.figures["ncnn_bin_bytes"] = BeforeAfter(
                *(_bytes(out.artifacts[k], ".bin") for k in ("ncnn", "ncnn pruned")))
        except WorkbenchError as err:
            out.errors["ncnn"] = err
    step("timing")
    latencies, out.timing = _latencies(out.artifacts, backends, inputs, threads, repeat,
                                       warmup)
    out.figures.update(latencies)
    return out


def _bytes(artifact: Artifact, suffix: str) -> int:
    """Bytes of the artifact's files ending in ``suffix`` (an ONNX model with its external
    data counts both)."""
    sizes = [rec.get("bytes", 0) for name, rec in artifact.files.items()
             if name.endswith(suffix) or (suffix == ".onnx" and name.endswith(".data"))]
    if sizes:
        return int(sum(sizes))
    return artifact.path.stat().st_size


def _latencies(artifacts: dict[str, Artifact], backends: Sequence[str], inputs: tuple,
               threads: int, repeat: int, warmup: int
               ) -> tuple[dict[str, BeforeAfter], Timing | None]:
    """Milliseconds of each backend's unpruned model (the median over the rounds of its
    fastest run in each) and pruned model (that times the median of the rounds' paired
    ratios), timed alternately in this process (``isolated=False``: the
    worker's transfer would blur a small model), each warmed until its time settled first;
    and how they were timed."""
    runners = _runners(artifacts, backends, threads)
    if not runners:
        return {}, None
    clock = CPU if threads == 1 else WALL
    feed = tuple(t.detach().cpu().numpy() for t in inputs)
    turns: dict[tuple[str, str], list[list[tuple[float, float]]]] = {k: [] for k in runners}
    keys = list(runners)
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: a collection inside a run is not the model's time
    try:
        warm = tuple(_settle(r, feed, warmup, clock) for r in runners.values())
        for r in range(repeat):
            shift = r % len(keys)
            for key in keys[shift:] + keys[:shift]:
                turns[key].append([_timed(runners[key], feed) for _ in range(TURN)])
    finally:
        if collecting:
            gc.enable()
    out, spread, wall = {}, {}, {}
    for name in ("ort_ms", "ncnn_ms"):
        pair = [turns.get((name, tag)) for tag in ("", " pruned")]
        if None in pair:
            continue
        best = [[min(run[clock] for run in turn) for turn in p] for p in pair]
        before = statistics.median(best[0])
        paired = statistics.median(b / a for a, b in zip(*best, strict=True))
        out[name] = BeforeAfter(before * 1e3, before * paired * 1e3)
        spread[name] = BeforeAfter(*(_relative_iqr(b) for b in best))
        # a wall clock, one run a turn: how the latency was timed before
        wall[name] = BeforeAfter(*(statistics.median(t[0][WALL] for t in p) * 1e3
                                   for p in pair))
    timed = [run for p in turns.values() for turn in p for run in turn]
    preempted = sum(w - c > max(PREEMPTED_S, PREEMPTED_FRACTION * c) for w, c in timed) \
        if clock == CPU else None
    return out, Timing(("wall", "cpu")[clock], repeat, TURN, warm, spread, wall, preempted,
                       len(timed))


def _runners(artifacts: dict[str, Artifact], backends: Sequence[str], threads: int
             ) -> dict[tuple[str, str], Any]:
    """{(figure, tag): runner} of the models to time, in this process."""
    from ..runtime import NcnnRunner, OrtRunner

    runners: dict[tuple[str, str], Any] = {}
    for tag in ("", " pruned"):
        if "onnxruntime" in backends and f"onnx{tag}" in artifacts:
            runners[("ort_ms", tag)] = OrtRunner(artifacts[f"onnx{tag}"], isolated=False,
                                                 num_threads=threads)
        if "ncnn" in backends and f"ncnn{tag}" in artifacts:
            runners[("ncnn_ms", tag)] = NcnnRunner(artifacts[f"ncnn{tag}"], isolated=False,
                                                   num_threads=threads)
    return runners


def _timed(runner: Any, feed: tuple) -> tuple[float, float]:
    """(wall seconds, the calling thread's CPU seconds) of one run."""
    w0, c0 = time.perf_counter(), time.thread_time()
    runner.run(feed, capture="outputs")
    return time.perf_counter() - w0, time.thread_time() - c0


def _settle(runner: Any, feed: tuple, warmup: int, clock: int) -> int:
    """Run ``runner`` untimed at least ``warmup`` times, then until its last SETTLE_RUNS
    times agree within SETTLE_TOLERANCE (a fresh session's or net's first runs allocate and
    fault in its buffers), at most SETTLE_MAX more; the runs made."""
    times: list[float] = []
    while len(times) < warmup + SETTLE_MAX:
        times.append(_timed(runner, feed)[clock])
        last = times[-SETTLE_RUNS:]
        if len(times) >= max(warmup, SETTLE_RUNS) and \
                max(last) <= (1 + SETTLE_TOLERANCE) * min(last):
            break
    return len(times)


def _relative_iqr(values: list[float]) -> float:
    """The interquartile range over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    mid = statistics.median(values)
    return (q3 - q1) / mid if mid else 0.0
