"""ncnn's fp32 and fp16 runs of a converted model, for its output check (ncnn_check.py): one
after the other in the shared native worker, each run's failure kept as its own result, and
the nets let go when the check returns.

Loading a large net is most of the check (a 2 GB decoder: 3.3 s fp32, 3.8 s fp16, then a run
of 0.5 s), and the two precisions are independent, so running them at once in two worker
processes was built and measured (issue 34): on this 2-core machine it was no faster with
both cores idle (each load 1.3-1.8x slower: page faults in two processes at once; runs 2-4x
slower: memory-bound, ncnn's threads spinning against each other) and 1.2-1.5x slower with
a core busy elsewhere, while one after the other the fp16 load reuses the memory the fp32
net freed in the same worker (runtime/heap.py keeps it): 0.9 s against 1.2 s. It was not
kept: nothing here could say when it would pay.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import shapes
from ..runtime.ncnn_runner import NcnnRunner
from ..runtime.worker import send_drops
from ..tolerances import max_errors

PRECISIONS = ("fp32", "fp16")


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


def run_precisions(param: Path, args: tuple, reference: list) -> dict[str, PrecisionRun]:
    """ncnn's fp32 and fp16 runs of ``param`` on ``args`` against ``reference``, one after
    the other in the shared worker.

    Returns:
        {precision: PrecisionRun}, fp32 first; a run that failed or crashed carries its
        error, never raises."""
    try:
        return {p: run_one(param, args, reference, p) for p in PRECISIONS}
    finally:  # the shared worker lets the last net go now, not at its next call
        send_drops()


def run_one(param: Path, args: tuple, reference: list, precision: str) -> PrecisionRun:
    """One precision's run, its failure kept in the result."""
    try:
        runner = NcnnRunner(param, precision=precision)
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
