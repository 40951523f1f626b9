"""The task metrics: a model's answers (top class, nearest embedding, pitch, decision) read
from its outputs and scored, candidate against reference, on plain arrays.

``Task`` picks one output and says whether a sample's output fits (``_check``) and how the
candidate's answers compare with the reference's (``_score``); ``TaskScore`` is the result.
task.py runs an evaluation set through the models and hands the outputs here. A sample's
output may hold a batch: the rows along its last axis are its predictions, in order
(``TopK``, ``NearestNeighbour``, ``PitchCents``); ``Decision`` takes one value a sample.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    import numpy as np

# CREPE's 360 pitch bins: bin b is 20*b cents above 1997.38 cents (10 Hz * 2**(cents/1200)),
# C1 (32.7 Hz) to B7 (1975.5 Hz) in 20-cent steps
CREPE_BINS, CENTS_PER_BIN, CENTS_OFFSET = 360, 20.0, 1997.3794084376191


@dataclass(frozen=True)
class TaskScore:
    """One candidate's answers against the reference's over the evaluation set.

    ``value`` in ``unit`` (agreement: the share agreeing; cents: the median pitch error;
    cosine: the mean cosine); ``agree`` of ``total`` predictions agree (None: the task counts
    none); ``text`` the phrase the summaries show ("top-1 agrees on 47/50");
    ``disagreeing`` the predictions that do not agree, by index (a sample's rows in turn)."""

    task: str
    value: float
    unit: str
    agree: int | None
    total: int
    text: str
    disagreeing: tuple[int, ...] = ()

    @property
    def fraction(self) -> float | None:
        """The share of predictions that agree (None: the task counts none)."""
        return None if self.agree is None or not self.total else self.agree / self.total

    @property
    def all_agree(self) -> bool | None:
        """Every prediction agrees (None: the task counts none)."""
        return None if self.agree is None else self.agree == self.total

    @property
    def cell(self) -> str:
        """The score in a table cell: "47/50", "4.1 cents, 30/30", "0.9987"."""
        figure = f"{self.value:.4g}" + (f" {self.unit}" if self.unit == "cents" else "")
        if self.agree is None:
            return figure
        count = f"{self.agree}/{self.total}"
        return count if self.unit == "agreement" else f"{figure}, {count}"

    def as_dict(self) -> dict[str, Any]:
        """The score's fields, for JSON."""
        return {"task": self.task, "value": self.value, "unit": self.unit, "agree": self.agree,
                "total": self.total, "text": self.text, "disagreeing": list(self.disagreeing)}

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Task:
    """What a model is for, scored over an evaluation set (the base of the built-ins).

    Attributes:
        data: the evaluation set: a list of samples, each a tuple of input tensors in the
            model's order (or one tensor for a one-input model); None: the inputs of the
            compare or precision_table call.
        output: the model output scored, by index (0: the first) or name.

    A subclass has a ``name`` and implements ``_check`` (does one sample's output fit) and
    ``_score`` (the reference's and candidate's outputs, checked, to a TaskScore).
    """

    data: Any = field(default=None, kw_only=True, repr=False, compare=False)
    output: int | str = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if isinstance(self.output, bool) or not isinstance(self.output, (int, str)):
            raise InputError(f"{type(self).__name__}(output={self.output!r}): expected an "
                             "output index (int) or an output name (str)",
                             "e.g. output=0 for the model's first output, or output='logits'")
        if self.data is not None and (not isinstance(self.data, (list, tuple))
                                      or not self.data):
            got = "an empty list" if isinstance(self.data, (list, tuple)) else \
                f"a {type(self.data).__name__}"
            raise InputError(f"{type(self).__name__}(data=...) is {got}; expected a list of "
                             "samples, each a tuple of input tensors",
                             "e.g. data=[(x1,), (x2,)]; a batched tensor splits into samples "
                             "with list(batch.split(1))")

    name = "task"

    def score(self, reference: list[np.ndarray], candidate: list[np.ndarray]) -> TaskScore:
        """Score the candidate's outputs against the reference's.

        Args:
            reference: the reference's selected output, one array per evaluation sample.
            candidate: the candidate's, the same samples in the same order.

        Returns:
            A TaskScore.

        Raises:
            InputError: the lists differ in length, a pair in size, or an output does not fit
                the metric (a 1-wide TopK, a PitchCents not 360 wide...).
        """
        import numpy as np

        if len(reference) != len(candidate) or not reference:
            raise InputError(f"task {self.name!r}: {len(reference)} reference output(s) and "
                             f"{len(candidate)} candidate output(s); expected one each per "
                             "evaluation sample", "score lists of equal, non-zero length")
        ref, cand = [], []
        for i, (r, c) in enumerate(zip(reference, candidate, strict=True)):
            r, c = np.asarray(r), np.asarray(c)
            if r.size != c.size:
                raise InputError(f"task {self.name!r}: sample {i}: the reference's output is "
                                 f"{list(r.shape)}, the candidate's {list(c.shape)}",
                                 "score outputs of the same model: the candidate converted "
                                 "from the reference, the same output selected")
            self._check(r.shape, f"sample {i}")
            ref.append(r)
            cand.append(c.reshape(r.shape))  # ncnn drops the batch axis: the reference's
        return self._score(ref, cand)

    def _check(self, shape: tuple[int, ...], where: str) -> None:
        """Raise an InputError when one sample's output (of ``shape``) does not fit."""

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        raise NotImplementedError

    def _unfit(self, shape: tuple[int, ...], where: str, expected: str, hint: str) -> InputError:
        return InputError(f"task {self.name!r} (output={self.output!r}): {where}'s output is "
                          f"{list(shape)}; {expected}", hint)

    def code(self, data_var: str = "task_data", fn_var: str = "fn") -> str:
        """The Python that builds this task, its data (and a Custom's fn) as variables."""
        args = [f"{k}={getattr(self, k)!r}" for k in self._code_fields()]
        if self.data is not None:
            args.append(f"data={data_var}")
        if self.output != 0:
            args.append(f"output={self.output!r}")
        return f"wb.{type(self).__name__}({', '.join(args)})"

    def _code_fields(self) -> list[str]:
        return []


def _rows(a: np.ndarray) -> np.ndarray:
    """A sample's output as rows along its last axis (a 0-d value: one row of one)."""
    import numpy as np

    a = np.asarray(a, np.float64)
    return a.reshape(-1, a.shape[-1] if a.ndim else 1)


def _stacked_rows(arrays: list[np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate([_rows(a) for a in arrays])


def _count(agree: np.ndarray) -> tuple[int, int, tuple[int, ...]]:
    import numpy as np

    return int(agree.sum()), int(agree.size), tuple(int(i) for i in np.flatnonzero(~agree))


@dataclass(frozen=True)
class TopK(Task):
    """The reference's top class among the candidate's top ``k`` (k=1: the same argmax):
    "top-1 agrees on 47/50". Class scores along the output's last axis."""

    k: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InputError(f"TopK(k={self.k!r}): expected a positive whole number of classes",
                             "k=1 compares the top class; k=5: the reference's top class "
                             "among the candidate's five best")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"top-{self.k}"

    def _check(self, shape: tuple[int, ...], where: str) -> None:
        width = shape[-1] if shape else 1
        if width < 2 or self.k >= width:
            raise self._unfit(shape, where, f"expected class scores along the last axis, more "
                              f"than k={self.k} of them ({width} there)",
                              "select the classifier's logits or probabilities with output=; "
                              "for one probability a sample use wb.Decision(threshold)")

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        import numpy as np

        r, c = _stacked_rows(ref), _stacked_rows(cand)
        top = r.argmax(axis=1)
        if self.k == 1:
            hit = c.argmax(axis=1) == top
        else:
            best = np.argpartition(-c, self.k - 1, axis=1)[:, :self.k]
            hit = (best == top[:, None]).any(axis=1)
        agree, total, off = _count(hit)
        return TaskScore(self.name, agree / total, "agreement", agree, total,
                         f"{self.name} agrees on {agree}/{total}", off)

    def _code_fields(self) -> list[str]:
        return ["k"]


@dataclass(frozen=True)
class NearestNeighbour(Task):
    """Embeddings (rows along the last axis): the mean cosine of each candidate embedding
    with its reference, and how many candidate embeddings have their own reference as the
    nearest (cosine) of all the reference embeddings: "nearest neighbour agrees on 23/24,
    cosine 0.9987". Needs at least 2 embeddings."""

    name = "nearest neighbour"

    def _check(self, shape: tuple[int, ...], where: str) -> None:
        if (shape[-1] if shape else 1) < 2:
            raise self._unfit(shape, where, "expected embeddings along the last axis (2 or "
                              "more wide)", "select the embedding output with output=")

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        import numpy as np

        r, c = _stacked_rows(ref), _stacked_rows(cand)
        if len(r) < 2:
            raise InputError(f"task {self.name!r}: {len(r)} embedding over the evaluation set; "
                             "a nearest neighbour needs at least 2",
                             "give data= two or more samples (sentences, images...)")

        def unit(a: np.ndarray) -> np.ndarray:
            n = np.linalg.norm(a, axis=1, keepdims=True)
            return a / np.where(n > 0, n, 1.0)

        r, c = unit(r), unit(c)
        cosine = float(np.mean(np.sum(r * c, axis=1)))
        sim = c @ r.T  # candidate i against every reference embedding
        # its own reference the nearest (a tie with an equal embedding counts as nearest)
        hit = np.diag(sim) >= sim.max(axis=1) - 1e-12
        agree, total, off = _count(hit)
        return TaskScore(self.name, cosine, "cosine", agree, total,
                         f"nearest neighbour agrees on {agree}/{total}, cosine {cosine:.4f}",
                         off)


def crepe_cents(activations: np.ndarray) -> np.ndarray:
    """Pitch in cents (above 10 Hz) of each row of CREPE's 360 bin activations: the average
    of the bins' cents weighted by their activation over the 9 bins around the peak
    (CREPE's local weighted average; frequency = 10 * 2**(cents / 1200)).

    Args:
        activations: (n, 360) sigmoid activations.

    Returns:
        (n,) cents.
    """
    import numpy as np

    a = np.asarray(activations, np.float64).reshape(-1, CREPE_BINS)
    cents = CENTS_PER_BIN * np.arange(CREPE_BINS) + CENTS_OFFSET
    peak = a.argmax(axis=1)
    window = peak[:, None] + np.arange(-4, 5)[None, :]  # 9 bins, clipped at the ends
    inside = (window >= 0) & (window < CREPE_BINS)
    window = window.clip(0, CREPE_BINS - 1)
    w = np.where(inside, np.take_along_axis(a, window, axis=1), 0.0)
    total = w.sum(axis=1)
    weighted = (w * cents[window]).sum(axis=1)
    return np.where(total > 0, weighted / np.where(total > 0, total, 1.0), cents[peak])


@dataclass(frozen=True)
class PitchCents(Task):
    """Pitch error in cents between the candidate's decoded pitch and the reference's:
    "median pitch error 4.1 cents, 30/30 within 50". Each row of the output (along its last
    axis) is one frame's 360 CREPE pitch bins, decoded by ``crepe_cents``.

    Attributes:
        decode: instead of CREPE's decoding, fn(rows: (n, width) array) -> (n,) frequencies
            in Hz (positive), for an output that is not CREPE's bins.
        within: the error, in cents, within which a frame agrees.
    """

    decode: Callable[[np.ndarray], Any] | None = None
    within: float = 50.0

    name = "pitch"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decode is not None and not callable(self.decode):
            raise InputError(f"PitchCents(decode={self.decode!r}) is not callable",
                             "decode=fn, fn(rows) -> frequencies in Hz; or leave it None for "
                             "CREPE's 360 pitch bins")
        if isinstance(self.within, bool) or not isinstance(self.within, numbers.Real) \
                or not 0 < self.within < math.inf:
            raise InputError(f"PitchCents(within={self.within!r}): expected a positive number "
                             "of cents", "e.g. within=50 (a quarter tone)")

    def _check(self, shape: tuple[int, ...], where: str) -> None:
        if self.decode is None and (shape[-1] if shape else 1) != CREPE_BINS:
            raise self._unfit(shape, where, f"expected {CREPE_BINS} pitch bins (CREPE's) "
                              "along the last axis", "select the pitch output with output=, "
                              "or decode another output to Hz: PitchCents(decode=fn)")

    def _cents(self, rows: np.ndarray, who: str) -> np.ndarray:
        import numpy as np

        if self.decode is None:
            return crepe_cents(rows)
        try:
            hz = np.asarray(self.decode(rows), np.float64).reshape(-1)
        except Exception as e:  # the user's decode: said with the task's name
            raise InputError(f"task {self.name!r}: decode raised on the {who}'s output: "
                             f"{type(e).__name__}: {e}", "decode(rows) takes an (n, width) "
                             "array and returns n frequencies in Hz") from e
        if hz.shape != (len(rows),) or not np.all(np.isfinite(hz) & (hz > 0)):
            raise InputError(f"task {self.name!r}: decode returned {hz.size} value(s) for "
                             f"{len(rows)} row(s) of the {who}'s output, expected that many "
                             "positive frequencies in Hz", "return one frequency (Hz > 0) "
                             "per row")
        return 1200.0 * np.log2(hz / 10.0)

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        import numpy as np

        err = np.abs(self._cents(_stacked_rows(cand), "candidate")
                     - self._cents(_stacked_rows(ref), "reference"))
        median = float(np.median(err))
        agree, total, off = _count(err <= self.within)
        return TaskScore(self.name, median, "cents", agree, total,
                         f"median pitch error {median:.1f} cents, {agree}/{total} within "
                         f"{self.within:g}", off)

    def _code_fields(self) -> list[str]:
        return ["within"] + (["decode"] if self.decode is not None else [])

    def code(self, data_var: str = "task_data", fn_var: str = "fn") -> str:
        return super().code(data_var).replace(f"decode={self.decode!r}", f"decode={fn_var}")


@dataclass(frozen=True)
class Decision(Task):
    """A binary decision, value > ``threshold`` (a speech probability, a detection score),
    one value a sample: "decision agrees on 58/60"."""

    threshold: float = 0.5

    name = "decision"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, numbers.Real) \
                or not math.isfinite(self.threshold):
            raise InputError(f"Decision(threshold={self.threshold!r}): expected a number",
                             "e.g. Decision(0.5) for a probability, Decision(0.0) for a logit")

    def _check(self, shape: tuple[int, ...], where: str) -> None:
        if math.prod(shape) != 1:
            raise self._unfit(shape, where, "expected one value a sample (the decision's score)",
                              "select the score output with output=; for class scores use "
                              "wb.TopK(1); give the samples one at a time (batch 1)")

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        import numpy as np

        r = np.array([float(a.reshape(-1)[0]) for a in ref]) > self.threshold
        c = np.array([float(a.reshape(-1)[0]) for a in cand]) > self.threshold
        agree, total, off = _count(r == c)
        return TaskScore(self.name, agree / total, "agreement", agree, total,
                         f"decision agrees on {agree}/{total}", off)

    def _code_fields(self) -> list[str]:
        return ["threshold"]


@dataclass(frozen=True)
class Custom(Task):
    """Anything else: ``fn(reference, candidate)``, each the selected output stacked over
    the samples (a new first axis), returns a number or a TaskScore.

    Attributes:
        fn: the score function.
        name: what the summaries call it (default: fn's name).
    """

    fn: Callable[[np.ndarray, np.ndarray], Any] = None  # type: ignore[assignment]
    name: str = ""  # type: ignore[assignment]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.fn):
            raise InputError(f"Custom(fn={self.fn!r}): fn is not callable",
                             "wb.Custom(lambda ref, cand: float(...), 'my metric')")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", "custom"))

    def _score(self, ref: list[np.ndarray], cand: list[np.ndarray]) -> TaskScore:
        import numpy as np

        if len({a.shape for a in ref}) > 1:
            raise InputError(f"task {self.name!r}: the samples' outputs differ in shape "
                             f"({sorted({a.shape for a in ref})}), so they do not stack",
                             "give data= samples of one shape, or score per sample in fn")
        try:
            got = self.fn(np.stack(ref), np.stack(cand))
        except Exception as e:  # the user's fn: said with the task's name
            raise InputError(f"task {self.name!r}: fn raised {type(e).__name__}: {e}",
                             "fn(reference, candidate) gets the output stacked over the "
                             "samples (a first axis of samples) and returns a number") from e
        if isinstance(got, TaskScore):
            return got
        if isinstance(got, np.ndarray) and got.size == 1 and got.dtype.kind in "iuf":
            got = got.reshape(-1)[0]
        if isinstance(got, bool | np.bool_) or not isinstance(got, numbers.Real):
            raise InputError(f"task {self.name!r}: fn returned a {type(got).__name__}, "
                             "expected a number or a TaskScore",
                             "return e.g. float(np.mean(...))")
        return TaskScore(self.name, float(got), "", None, len(ref),
                         f"{self.name} {float(got):.4g}")

    def code(self, data_var: str = "task_data", fn_var: str = "fn") -> str:
        return super().code(data_var).replace("wb.Custom(", f"wb.Custom({fn_var}, "
                                              f"{self.name!r}, ", 1).replace(", )", ")")


__all__ = ["Task", "TaskScore", "TopK", "NearestNeighbour", "PitchCents", "Decision", "Custom",
           "crepe_cents", "CREPE_BINS", "CENTS_OFFSET"]
