"""What pruning did to the model a backend runs: each figure before and after, side by side,
and the note a user must read (zeroed weights are still stored and still multiplied)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..artifact.record import Artifact
    from ..errors import WorkbenchError


@dataclass(frozen=True)
class BeforeAfter:
    """One figure of the unpruned model and of the pruned one; ``ratio`` is after / before
    (0.5: halved; None when before is 0)."""

    before: float
    after: float

    @property
    def ratio(self) -> float | None:
        return self.after / self.before if self.before else None


@dataclass(frozen=True)
class Timing:
    """How the latencies were measured (stages/prune_measure.py says why). ``clock``: "cpu"
    with one thread (each run's CPU time on the calling thread, where both backends run a
    one-thread model: its cost without the time other processes had the core) or "wall"
    with more. ``rounds`` alternating rounds, each running every model ``turn`` times in
    a row, after ``warmup_runs`` untimed runs of each model (at least ``warmup``, more until
    its last three times agreed within 10%). Each turn's fastest run counts (its first runs
    refill the caches the other models evicted; interference only adds time): the
    unpruned latency is their median over the rounds, the pruned one that times the median
    of the rounds' ratios (pruned over unpruned, in the same round). ``spread`` {figure:
    BeforeAfter of the interquartile range / median of each turn's fastest run};
    ``wall_ms`` {figure: BeforeAfter of the median wall time
    of each turn's first run, as a wall clock timed it before}; ``preempted`` of the
    ``runs`` runs took longer on the wall than on the CPU (another process had the core;
    None with the wall clock)."""

    clock: str
    rounds: int
    turn: int
    warmup_runs: tuple[int, ...]
    spread: dict[str, BeforeAfter]
    wall_ms: dict[str, BeforeAfter]
    preempted: int | None
    runs: int

    def line(self, threads: int, load: tuple[float, float]) -> str:
        """One line: what was timed, how, its spread and the load."""
        what = ("the calling thread's CPU time per run (other processes' time on the core "
                "left out)" if self.clock == "cpu" else "wall time per run")
        spread = ", ".join(f"{k.split('_')[0]} ±{max(v.before, v.after) / 2:.0%}"
                           for k, v in self.spread.items())
        warm = f"{min(self.warmup_runs)}-{max(self.warmup_runs)}" if self.warmup_runs else "0"
        out = (f"latency: {what}, the fastest of {self.turn} runs in a row, {self.rounds} "
               f"alternating rounds, pruned / unpruned the median of the rounds' ratios, "
               f"after {warm} warm-up runs per model (until its time settled); spread "
               f"(IQR/2) {spread}; {threads} thread(s), load {load[0]:.1f} -> {load[1]:.1f}")
        if self.preempted:
            out += (f"; {self.preempted} of {self.runs} timed runs were preempted by other "
                    "processes (their wall time is not the model's)")
        return out


@dataclass
class PruneReport:
    """The pruned model against the unpruned one, measured the same way.

    ``amount`` is what was asked: the fraction of the Conv/Linear weights to take away;
    ``weights_pruned`` what was done (removed with their channels, or set to zero);
    ``channel_ratio`` the ratio of channels torch-pruning removed per group (structured).
    ``params`` and ``macs`` count the torch module (torch-pruning's
    ``count_ops_and_params``); ``onnx_nodes`` / ``onnx_bytes`` are the exported ONNX files
    (``wb.export``), ``ncnn_bin_bytes`` the ncnn weights (``wb.to_ncnn``); ``ort_ms`` /
    ``ncnn_ms`` latencies in milliseconds, unpruned and pruned run alternately in this
    process on the example inputs with ``threads`` threads (``timing`` says how: with one
    thread, from each run's CPU time on the calling thread). A backend figure is None
    when that backend was not asked for or failed (``errors`` says why). ``snr_db`` and
    ``max_abs`` compare the pruned torch model's outputs with the unpruned one's (worst
    output).
    """

    method: str
    amount: float
    weights_pruned: float
    channel_ratio: float | None
    params: BeforeAfter
    macs: BeforeAfter
    snr_db: float
    max_abs: float
    ignored: list[str] = field(default_factory=list)
    output_layers: list[str] = field(default_factory=list)
    onnx_nodes: BeforeAfter | None = None
    onnx_bytes: BeforeAfter | None = None
    ncnn_bin_bytes: BeforeAfter | None = None
    ort_ms: BeforeAfter | None = None
    ncnn_ms: BeforeAfter | None = None
    artifacts: dict[str, Artifact] = field(default_factory=dict, repr=False)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)
    round_to: int | None = None  # structured: every pruned width a multiple of this
    threads: int = 1
    repeat: int = 0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at start and end
    seconds: float = 0.0
    timing: Timing | None = None  # how ort_ms / ncnn_ms were measured

    @property
    def structured(self) -> bool:
        return self.method.endswith("-structured")  # not "l1-unstructured"

    def figures(self) -> dict[str, BeforeAfter]:
        """{row label: figure} of every figure measured, in table order."""
        rows = {"parameters": self.params, "MACs": self.macs, "ONNX nodes": self.onnx_nodes,
                "ONNX file (bytes)": self.onnx_bytes,
                "ncnn .bin (bytes)": self.ncnn_bin_bytes,
                "ONNX Runtime latency (ms)": self.ort_ms, "ncnn latency (ms)": self.ncnn_ms}
        return {k: v for k, v in rows.items() if v is not None}

    def table(self) -> list[dict[str, Any]]:
        """One record per figure: figure, before, after, ratio (after / before)."""
        return [{"figure": k, "before": v.before, "after": v.after, "ratio": v.ratio}
                for k, v in self.figures().items()]

    def summary(self) -> str:
        """One line: the method, what was pruned, each ratio and the output change."""
        parts = [f"{k.split(' (')[0]} x{_ratio(v.ratio)}" for k, v in self.figures().items()]
        return (f"{self.method} {self.amount:.0%} ({self.weights_pruned:.1%} of conv/linear "
                f"weights {'removed' if self.structured else 'zeroed'}): {', '.join(parts)}; "
                f"output SNR {self.snr_db:.1f} dB vs unpruned")

    def notes(self) -> list[str]:
        """What the figures mean for the deployed model, in sentences."""
        out = []
        if not self.structured:
            sizes = ", ".join(f"{k} x{_ratio(v.ratio)}" for k, v in (
                ("ONNX file", self.onnx_bytes), ("ncnn .bin", self.ncnn_bin_bytes),
                ("ONNX Runtime latency", self.ort_ms), ("ncnn latency", self.ncnn_ms))
                if v is not None)
            out.append("unstructured pruning zeroes weights but keeps every one: the dense "
                       "ONNX file and ncnn .bin store the zeros and the backends multiply "
                       "them, so file size and latency stay where they were"
                       + (f" ({sizes})" if sizes else "") + ". Only structured pruning "
                       "(whole channels, method='l1-structured') shrinks the deployed model.")
        else:
            kept = ", ".join(self.output_layers) or "none"
            out.append(f"{self.channel_ratio or 0:.0%} of each prunable group's channels "
                       "were removed, kept consistent across residual adds and concats; the "
                       f"layers producing the outputs kept their width ({kept}).")
            out += self._width_notes()
        if self.snr_db < 20:
            out.append(f"the outputs moved (SNR {self.snr_db:.1f} dB, max abs "
                       f"{self.max_abs:.3g} vs the unpruned model): pruning without "
                       "fine-tuning costs accuracy; fine-tune the pruned model before "
                       "deploying it.")
        for stage, err in self.errors.items():
            out.append(f"{stage} not measured: {type(err).__name__}: "
                       f"{err.message.splitlines()[0][:200]}")
        return out

    def _width_notes(self) -> list[str]:
        """What the widths' rounding did to the amount, or what no rounding may cost."""
        if self.round_to is None:
            return ["widths were pruned to the exact ratio (round_to=None): a width that is "
                    "not a multiple of 8 falls off the packed kernels of ONNX Runtime "
                    "(NCHWc) and ncnn (elempack 4/8), which can leave the pruned model "
                    "slower than the unpruned one; round_to=8 keeps them packed."]
        if abs(self.weights_pruned - self.amount) > 0.03:
            return [f"widths move in steps of round_to={self.round_to}: the closest to "
                    f"{self.amount:.0%} was {self.weights_pruned:.1%}; round_to=4 or None "
                    "comes closer (None at the cost of packed kernels)."]
        return []

    def text(self) -> str:
        rows = [("figure", "unpruned", "pruned", "after/before")]
        rows += [(k, _num(v.before), _num(v.after), _ratio(v.ratio))
                 for k, v in self.figures().items()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        rounded = f", round_to={self.round_to}" if self.structured else ""
        lines = [f"PruneReport: {self.method}{rounded}, amount {self.amount:.0%} "
                 f"({self.weights_pruned:.1%} of conv/linear weights "
                 f"{'removed' if self.structured else 'zeroed'})"]
        lines += ["  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                            for j, (c, w) in enumerate(zip(r, widths, strict=True)))
                  for r in rows]
        lines.append(f"output vs unpruned: SNR {self.snr_db:.1f} dB, max abs "
                     f"{self.max_abs:.3g}")
        if self.timing is not None and (self.ort_ms or self.ncnn_ms):
            lines.append(self.timing.line(self.threads, self.load))
        return "\n".join(lines + [f"note: {n}" for n in self.notes()])

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{_num(v.before)}</td>"
            f"<td style='text-align:right'>{_num(v.after)}</td>"
            f"<td style='text-align:right'><b>x{_ratio(v.ratio)}</b></td></tr>"
            for k, v in self.figures().items())
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes())
        return (f"<div><b>{html.escape(self.summary())}</b><table><tr><th>figure</th>"
                f"<th>unpruned</th><th>pruned</th><th>after/before</th></tr>{body}</table>"
                f"{notes}</div>")


@dataclass
class PruneResult:
    """``wb.prune``'s answer: ``model`` the pruned module (a deep copy; the module given is
    unchanged) and ``report`` the figures, before and after."""

    model: Any
    report: PruneReport

    def __repr__(self) -> str:
        return f"PruneResult(model={type(self.model).__name__}, report=...)\n{self.report.text()}"

    def _repr_html_(self) -> str:
        return self.report._repr_html_()


def _num(v: float) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return f"{int(v):,}"


def _ratio(r: float | None) -> str:
    return "-" if r is None or math.isnan(r) else f"{r:.2f}"
