"""ncnn's fp32 and fp16 runs of a converted model, for its output check (ncnn_check.py): at
once, each in a native worker process of its own, when the machine has a core for each and
both nets fit in memory together; else one after the other in the shared worker.

Loading a large net is most of the check (a 2 GB decoder: 3.3 s fp32, 3.8 s fp16, then a run
of 0.5 s) and the two precisions are independent, but one worker runs its ncnn calls one at a
time (on its main thread). So the fp16 net may go to a worker of its own
(``worker.spare()``), loaded and run while the shared native worker loads and runs the fp32
one: about the longer of the two instead of their sum, given cores to run both. That worker
is closed after the check (``worker.retire``): kept, it would hold the fp16 net until its
next call, and an idle process costs 100-200 MB; starting one costs ~0.4 s (numpy, ncnn and
the runner imported), paid only on models whose loads take longer (``SIDE_BY_SIDE_BYTES``).

Side by side is not free: a load is page faults, and in one worker the second net reuses
the memory the first one freed (runtime/heap.py keeps it), while a fresh process faults in
its own; two runs at once also contend for memory bandwidth and spin ncnn's threads against
each other. On a 2-core machine it was no faster, and slower with a core busy elsewhere
(another job, or to_ncnn's own hashing of pnnx's files), so it needs ``IDLE_CORES`` idle,
sampled when the check starts: on 2 cores the runs go one after the other, as before. It
also runs them one after the other when both nets do not fit in memory at once
(``capacity.check_fits``, ncnn's factor twice) and when the model holds Python custom
layers that cannot travel to a worker (they run in this process). Each run's failure is its
own: a crash in one worker leaves the other's outputs.
"""

from __future__ import annotations

import os
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import customops as cops
from .. import shapes
from ..capacity import FACTORS, check_fits
from ..runtime.ncnn_runner import NcnnRunner
from ..runtime.worker import Place, retire, send_drops, spare
from ..tolerances import max_errors

PRECISIONS = ("fp32", "fp16")
# model files from which the fp16 run gets a worker of its own: a worker's start (a Python
# importing numpy and ncnn, ~0.3 s here) is below the time to load a net this size
SIDE_BY_SIDE_BYTES = 256 << 20
# cores that must be idle: each run's ncnn threads (NcnnRunner's num_threads=2) a core each.
# Measured on this 2-core VM (a 4-layer decoder, 1.3 GB): side by side was no faster even
# with both cores idle (each load 1.3-1.8x slower: page faults in two processes at once, and
# runs 2-4x slower: memory-bound, with ncnn's threads spinning against each other), and
# 1.2-1.5x slower with one core busy elsewhere; one after the other, the fp16 load reuses
# the memory the fp32 net freed in the same worker (runtime/heap.py keeps it)
IDLE_CORES = 4.0


@dataclass(frozen=True)
class PrecisionRun:
    """One precision's run on the example inputs: ``got``, the outputs as ncnn returned
    them; ``fitted``, the same in torch's shapes; ``errors``, their ``max_errors`` against
    the reference (all None when the run failed: ``failure`` says why); ``pid``, the worker
    process that ran it (None: this process)."""

    precision: str
    got: list | None = None
    fitted: list | None = None
    errors: dict[str, Any] | None = None
    failure: Exception | None = None
    pid: int | None = None


def run_precisions(param: Path, args: tuple, reference: list,
                   side_by_side: bool | None = None) -> dict[str, PrecisionRun]:
    """ncnn's fp32 and fp16 runs of ``param`` on ``args`` against ``reference``.

    Args:
        side_by_side: True runs them at once in two worker processes; False, one after
            the other in the shared worker; None decides (``fits_side_by_side``).

    Returns:
        {precision: PrecisionRun}, fp32 first; a run that failed or crashed carries its
        error, never raises."""
    if side_by_side is None:
        side_by_side = fits_side_by_side(param)
    try:
        if not side_by_side:
            return {p: run_one(param, args, reference, p) for p in PRECISIONS}
        return _side_by_side(param, args, reference)
    finally:  # the shared worker lets the last net go now, not at its next call
        send_drops()


def _side_by_side(param: Path, args: tuple, reference: list) -> dict[str, PrecisionRun]:
    place = spare()
    pool = ThreadPoolExecutor(1, thread_name_prefix="wb-ncnn-fp16")
    try:
        fp16 = pool.submit(run_one, param, args, reference, "fp16", place)
        fp32 = run_one(param, args, reference, "fp32")
        return {"fp32": fp32, "fp16": fp16.result()}
    finally:  # the fp16 net goes with its process (an interrupted run too)
        retire(place)
        pool.shutdown(wait=True)


def fits_side_by_side(param: Path, available: int | None = None,
                      idle: float | None = None) -> bool:
    """Whether the two runs go to two workers at once: a model large enough for a second
    process to pay, whose nets fit in memory together (``available`` bytes; None: read
    now), on a machine with the cores idle that both runs' ncnn threads take
    (``IDLE_CORES``; ``idle``: None samples them now, ``idle_cores``), with no Python
    custom layer that must run in this process."""
    fit = check_fits(param, f"ncnn's fp32 and fp16 nets of {param.name} at once",  # + .bin
                     factor=2 * FACTORS["ncnn-net"], available=available, force=True)
    if fit.model_bytes < SIDE_BY_SIDE_BYTES or not fit.fits:
        return False
    if idle is None:  # sampled (0.2 s) only where the machine has the cores at all
        idle = idle_cores() if (os.cpu_count() or 1) >= IDLE_CORES else 0.0
    # last: a custom op that cannot be pickled warns (CustomOpWarning) when asked
    return idle >= IDLE_CORES and cops.for_worker(param) is not None


def idle_cores(seconds: float = 0.2) -> float:
    """How many of the machine's cores were idle over the next ``seconds`` (/proc/stat's
    idle and iowait time over its total, times the cores); 0 where there is no /proc."""
    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        return ticks[3] + ticks[4], sum(ticks)

    first = sample()
    time.sleep(seconds)
    last = sample()
    if first is None or last is None or last[1] <= first[1]:
        return 0.0
    return (last[0] - first[0]) / (last[1] - first[1]) * (os.cpu_count() or 1)


def run_one(param: Path, args: tuple, reference: list, precision: str,
            place: Place | None = None) -> PrecisionRun:
    """One precision's run (in the worker of ``place``; None: the shared one), its failure
    kept in the result."""
    try:
        runner = NcnnRunner(param, precision=precision, _place=place)
        got, fitted, errs = _errors(runner, args, reference)
    except Exception as e:  # recorded: the converted model is kept either way
        # the frames' locals let go (the runner among them): its twin can be dropped now
        traceback.clear_frames(e.__traceback__)
        return PrecisionRun(precision, failure=e)
    return PrecisionRun(precision, got, fitted, errs, pid=runner.worker_pid)


def ncnn_errors(param: Path, args: tuple, reference: list, precision: str
                ) -> tuple[list, list, dict[str, Any]]:
    """ncnn's outputs on ``args`` as it returns them, the same fitted to torch's shapes
    (paired by position, ``shapes.fit``: a dropped or squeezed size-1 axis), and their
    ``max_errors`` against ``reference``. Raises what the runner raises."""
    return _errors(NcnnRunner(param, precision=precision), args, reference)


def _errors(runner: NcnnRunner, args: tuple, reference: list
            ) -> tuple[list, list, dict[str, Any]]:
    got = list(runner.run(args).values())
    fitted = [shapes.fit(np.asarray(g), np.shape(r)) for r, g in zip(reference, got,
                                                                     strict=False)] + got[
        len(reference):]
    return got, fitted, max_errors(reference, fitted)
