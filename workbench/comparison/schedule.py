"""How a comparison's work is scheduled on a small machine; what is compared is compare()'s.

Two cores here. The candidates' runners (built by compare) use one intra-op thread each and
capture at once in the worker, while the calling thread runs torch (one thread too) and
then aligns and measures whatever capture is done. Single-threaded runs share cores by plain
time slicing; multi-threaded ones on too few cores wait at every barrier (ncnn ran twice as
slow beside a 2-thread torch), and one at a time leaves cores idle. Captures run at most one
ahead of the measuring (two candidates' values alive at once) unless the models are large
(``captures_ahead``); in isolated mode the next starts only once this one is measured (peak
memory). The measuring splits over two threads:
the metrics kernel releases the GIL.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..inputs import torch_threads
from .align import samples

if TYPE_CHECKING:
    from .candidates import Candidate

J = TypeVar("J")
R = TypeVar("R")


class Schedule:
    """The comparison's threads: a measuring thread beside the caller's, and each input
    set's captures (``captures``). Use as a context manager; ``close`` stops them.

    While it is open, torch runs on one thread (process-wide, restored on close): the
    reference's capture, and every torch op of the comparison besides it (the inputs'
    copies). A torch op on two threads wakes libgomp's second thread, which then spins
    (GOMP_SPINCOUNT, milliseconds) on a core the captures need: 20-40 ms of CPU a
    50-layer residual CNN's comparison, measured per thread, and none with one thread
    throughout."""

    def __init__(self) -> None:
        self._restore = contextlib.ExitStack()  # the caller's torch threads, on close
        self._restore.enter_context(torch_threads(1))
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="wb-compare-measure")
        self.pool.submit(_warm_metrics)  # numba loads or compiles its kernel meanwhile

    def __enter__(self) -> Schedule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self._restore.close()  # once: a second close finds nothing to restore

    @contextlib.contextmanager
    def captures(self, cands: Sequence[Candidate], args: Sequence[tuple],
                 mode: str) -> Iterator[Captures]:
        """Each candidate's capture="all" run on its own ``args``, started now in the
        background (``captures_ahead``: one ahead of the measuring in accumulated mode for
        models that are not large, else none); stopped on leaving the block."""
        caps = Captures(list(cands), list(args), ahead=captures_ahead(cands, mode),
                        release=large(cands))
        try:
            yield caps
        finally:
            caps.stop()

    @staticmethod
    def reference(runner: Any, args: tuple) -> dict[str, Any]:
        """The reference's capture="all" run, torch on one thread (the schedule's: the
        captures take the other core)."""
        return runner.run(args, capture="all")

    def measure(self, fn: Callable[[J], R], jobs: list[J],
                side: Callable[[], Any] | None = None,
                on_done: Callable[[int], None] | None = None) -> list[R]:
        """fn(job) for every job, in order, shared by the calling thread and the measuring
        thread as each is free (every thread here is single-threaded work, so a third one
        would only time-slice). ``side`` (Python work: aligning the next candidate) runs
        first in the calling thread while the measuring thread starts on the jobs; the
        metrics kernel releases the GIL, so the two overlap. ``on_done(n)``, called in the
        calling thread as it finishes a job, says how many jobs are done (the progress)."""
        out: list[Any] = [None] * len(jobs)
        lock = threading.Lock()
        todo = list(range(len(jobs)))[::-1]  # popped from the end: jobs in order
        done = [0]
        caller = threading.get_ident()

        def drain() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                out[i] = fn(jobs[i])
                with lock:
                    done[0] += 1
                    n = done[0]
                if on_done is not None and threading.get_ident() == caller:
                    on_done(n)

        helper = self.pool.submit(drain)
        try:
            if side is not None:
                side()
            drain()
        except BaseException:
            with lock:
                todo.clear()  # the measuring thread stops after its current job
            raise
        finally:
            helper.result()  # the measuring thread's exception, if any, is raised here
        if on_done is not None and jobs:
            on_done(len(jobs))  # all of them (the last may have been the other thread's)
        return out


# Candidates' model files past this many bytes together are captured one at a time. A
# capture ahead holds a second model and its every tensor beside the one being measured: on
# a 0.5B decoder (ONNX and ncnn, 2 GB each) the comparison peaked at 11.2 GB where torch, an
# ONNX Runtime session and an ncnn net run plainly peak at 7.2 GB, to save the seconds the
# second capture overlaps the first's measuring.
AHEAD_BYTES = 1 << 30


def large(cands: Sequence[Candidate]) -> bool:
    """Whether the candidates' models together pass AHEAD_BYTES: captured one at a time,
    each let go from the worker once measured (``Captures.release``)."""
    from ..capacity import model_files

    return sum(n for c in cands for _, n in model_files(c.path)) > AHEAD_BYTES


def captures_ahead(cands: Sequence[Candidate], mode: str) -> int:
    """How many captures may run ahead of the candidate being measured: one in accumulated
    mode when the candidates' models are not ``large``; none for larger ones, in isolated
    mode (each of its runs holds a model per layer) or both."""
    return 1 if mode == "accumulated" and not large(cands) else 0


class Captures:
    """Each candidate's capture="all" run, each in a thread of its own (the worker runs
    them at once), at most ``ahead`` captures ahead of the candidate being measured:
    ``done(k)`` lets capture k + 1 + ahead start."""

    def __init__(self, cands: list[Candidate], args: list[tuple], ahead: int,
                 release: bool = False) -> None:
        self.futures: list[Future] = [Future() for _ in cands]
        self.ahead = ahead
        self.release = release  # each candidate's model let go once measured (large ones)
        self.slots = threading.Semaphore(1 + ahead)
        self.stopped = False
        threading.Thread(target=self._run, args=(cands, args), daemon=True,
                         name="wb-compare-captures").start()

    def _run(self, cands: list[Candidate], args: list[tuple]) -> None:
        for fut, cand, own in zip(self.futures, cands, args, strict=True):
            self.slots.acquire()
            if self.stopped:
                return
            threading.Thread(target=self._capture, args=(fut, cand, own), daemon=True,
                             name="wb-compare-capture").start()

    @staticmethod
    def _capture(fut: Any, cand: Candidate, args: tuple) -> None:
        try:
            values = cand.runner.run(args, "all")
            fut.set_result((values, samples(values)))
        except BaseException as e:  # noqa: BLE001 - raised where the result is read
            fut.set_exception(e)

    def get(self, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(values, align samples of them) of candidate k's capture, once: not kept here,
        so the caller decides when the values go."""
        result = self.futures[k].result()
        self.futures[k] = spent = Future()
        spent.set_result(None)
        return result

    def done(self, k: int) -> None:
        """Candidate k is measured: the next capture may start (call once per k)."""
        self.slots.release()

    def stop(self) -> None:
        """No further captures; those running finish in the worker."""
        self.stopped = True
        self.slots.release(len(self.futures))


def _warm_metrics() -> None:
    """Build (or load from numba's cache) the metrics kernel for float32 pairs."""
    import numpy as np

    from .metrics import Tolerance, tensor_metrics

    tensor_metrics(np.zeros(2, np.float32), np.zeros(2, np.float32), Tolerance())
