"""CompareReport: the records of a comparison, its summary, table, plots and repro."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..shapes import unbatched
from .figures import Figures
from .fp16_risk import DEFAULT_MIN_SNR_DB, Fp16Risks, fp16_unsafe, overflow_note
from .record import Record

if TYPE_CHECKING:
    import numpy as np

    from ..runtime import Runner
    from .align import Alignment
    from .candidates import Candidate
    from .metrics import Tolerance
    from .sensitivity import Ranking
    from .task import TaskScore
    from .verdict import Verdict

# an op that all ops pass on their own but that holds most of the error the accumulated run
# breaks tolerance with: at least this share of its own tolerance, and this many times the
# share of any other op before that point (CompareReport.error_sources)
SOURCE_SHARE, SOURCE_LEAD = 0.05, 10.0

COLUMNS = ["candidate", "mode", "order", "name", "reference", "op_type", "max_abs", "mean_abs",
           "max_rel", "cosine", "snr_db", "frac_over_tol", "min_tol", "noise_floor", "tolerance",
           "passed", "relation"]


@dataclass
class CompareReport:
    """What ``wb.compare`` found: ``records`` (one per aligned tensor, candidate and mode),
    each candidate's ``alignments``, and the verdicts, summary, table, plots and repro built
    on them."""

    records: list[Record]
    alignments: dict[str, Alignment]
    candidates: list[Candidate]
    isolated_available: dict[str, bool] = field(default_factory=dict)
    tolerance: Tolerance | None = None
    inputs: tuple = ()
    reference: Runner | None = None
    unmeasured: dict[str, dict[str, str]] = field(default_factory=dict)  # cand -> {tensor: why}
    min_explained: float = 0.5
    # {candidate: what its figures are not}, e.g. an fp16 ncnn run that ncnn ran in fp32
    notes: dict[str, str] = field(default_factory=dict)
    # {candidate: why its run failed}: it crashed, hung or raised; nothing of it is measured
    failed: dict[str, str] = field(default_factory=dict)
    # {candidate: its task metric's score} (wb.compare(..., task=...)): the model's answers
    task: dict[str, TaskScore] = field(default_factory=dict)
    _sensitivity: dict[str, Ranking] = field(default_factory=dict, repr=False)
    _reference_values: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- what was aligned ---------------------------------------------------------------------
    @property
    def aligned_fraction(self) -> dict[str, float]:
        """{candidate name: fraction of its float tensors aligned to a torch module or op}."""
        return {name: al.fraction for name, al in self.alignments.items()}

    @property
    def unaligned(self) -> dict[str, dict[str, str]]:
        """{candidate name: {tensor: why it has no reference}} (listed, not dropped)."""
        return {name: dict(al.unaligned) for name, al in self.alignments.items()}

    @property
    def attributed(self) -> dict[str, dict[str, str]]:
        """{candidate name: {tensor: the module it is a step inside}}: a lowered op's steps,
        which torch never computed, so nothing measures them."""
        return {name: dict(al.attributed) for name, al in self.alignments.items()}

    def verdicts(self) -> dict[str, Verdict]:
        """{candidate name: Verdict}: something compared, enough explained, all passed."""
        from .verdict import verdict

        return {c.name: verdict(c.name, self.alignments.get(c.name),
                                [r for r in self.records if r.candidate == c.name],
                                self.min_explained, self.failed.get(c.name))
                for c in self.candidates}

    # -- where it breaks ----------------------------------------------------------------------
    def divergences(self) -> dict[str, Record]:
        """{candidate: first failing record}, by isolated error where available."""
        out = {}
        for cand in self.candidates:
            mode = "isolated" if self.isolated_available.get(cand.name) else "accumulated"
            # among exactly related tensors only: a tensor related otherwise is no op's own
            failing = [r for r in self.records if r.candidate == cand.name and r.mode == mode
                       and not r.metrics.passed and r.exact]
            if failing:
                out[cand.name] = min(failing, key=lambda r: r.order)
        return out

    def error_sources(self) -> dict[str, Record]:
        """{candidate: the op the accumulated error most likely comes from}, for a candidate
        whose ops all pass on their own (isolated) while the accumulated error breaks
        tolerance further on, so that no op is a divergence. Named only when one op before
        that point stands out: its isolated error at least ``SOURCE_SHARE`` of its tolerance
        and ``SOURCE_LEAD`` times the next op's share (a convolution-attention hybrid in
        ncnn with a damaged key: the fused MultiHeadAttention at 0.22 of its tolerance, every
        other op at 0.004
        or less). Not a divergence: its error is within tolerance where it is made."""
        found = {c.name: self._source(c.name) for c in self.candidates}
        return {name: got[0] for name, got in found.items() if got is not None}

    def _source(self, candidate: str) -> tuple[Record, float, float] | None:
        """(the error source, its share of its tolerance, the next op's share) or None."""
        if not self.isolated_available.get(candidate):
            return None
        mine = [r for r in self.records if r.candidate == candidate and r.exact]
        over = [r.order for r in mine if r.mode == "accumulated" and not r.metrics.passed]
        if not over or any(r.mode == "isolated" and not r.metrics.passed for r in mine):
            return None  # within tolerance everywhere, or an op is a divergence
        shares = sorted(((r.metrics.max_abs / r.metrics.tolerance, r) for r in mine
                         if r.mode == "isolated" and r.order <= min(over)
                         and r.metrics.tolerance > 0), key=lambda x: -x[0])
        if not shares:
            return None
        (top, rec), runner_up = shares[0], (shares[1][0] if len(shares) > 1 else 0.0)
        if top >= SOURCE_SHARE and top >= SOURCE_LEAD * runner_up:
            return rec, top, runner_up
        return None

    @property
    def first_divergence(self) -> Record | None:
        """The earliest op (topological order) whose error breaks tolerance, isolated error
        first; None when every aligned tensor passes."""
        found = list(self.divergences().values())
        return min(found, key=lambda r: r.order) if found else None

    @property
    def ok(self) -> bool:
        """Every candidate compared something, explained enough of its tensors, and every
        measured tensor is within tolerance."""
        return bool(self.candidates) and all(v.ok for v in self.verdicts().values())

    # -- presenting ---------------------------------------------------------------------------
    def summary(self) -> str:
        """One line per candidate: aligned, worst error and where, first divergence, and
        why its comparison is not ok when it is not; then a line per candidate scored by a
        task metric (``task_lines``).

        Returns:
            The lines, joined by newlines.
        """
        lines = []
        verdicts = self.verdicts()
        divergences = self.divergences()
        for cand in self.candidates:
            recs = [r for r in self.records if r.candidate == cand.name and r.mode ==
                    "accumulated"] or [r for r in self.records if r.candidate == cand.name]
            al = self.alignments.get(cand.name)
            aligned = f"{len(al.pairs)}/{al.considered} aligned" if al else "not aligned"
            if al is not None and al.attributed:
                aligned += f", {len(al.attributed)} attributed"
            v = verdicts[cand.name]
            skipped = self.unmeasured.get(cand.name)
            note = (f"; {len(skipped)} pair(s) not measured (report.unmeasured)"
                    if skipped else "")
            if cand.name in self.notes:
                note += f"; NOTE: {self.notes[cand.name]}"
            why = "; ".join(v.reasons)
            if not recs:
                lines.append(f"{cand.name}: {aligned}; NOT OK: {why}{note}")
                continue
            worst = max(recs, key=lambda r: r.metrics.max_abs)
            div = divergences.get(cand.name)
            if div:
                covers = f" covering {', '.join(div.covers)}" if div.covers else ""
                tail = (f"first divergence at {div.reference}{covers} ({div.op_type} "
                        f"{div.name}, {div.mode} max abs {div.metrics.max_abs:.3g} over "
                        f"tolerance {_bound(div.metrics)})")
                overflow = overflow_note(self, div)
                tail += f": {overflow}" if overflow else ""
            elif not v.passed:
                tail = self._no_culprit(cand.name)
            else:  # never "all within tolerance" over too little compared
                tail = "what was compared is within tolerance" if v.reasons else \
                    "all within tolerance"
            if v.reasons:
                tail = f"NOT OK: {why}; {tail}"
            lines.append(f"{cand.name}: {aligned}, worst max abs "
                         f"{worst.metrics.max_abs:.3g} at {worst.reference}; {tail}{note}")
        return "\n".join(lines + self.task_lines())

    def task_lines(self) -> list[str]:
        """A line per candidate the task metric scored: "onnxruntime a: top-1 agrees on 47/50"
        (none without a task)."""
        return [f"{c.name}: {self.task[c.name].text}" for c in self.candidates
                if c.name in self.task]

    def task_rows(self) -> list[dict[str, Any]]:
        """The task scores as table rows: the candidate, then ``TaskScore.as_dict``."""
        return [{"candidate": c.name, **self.task[c.name].as_dict()} for c in self.candidates
                if c.name in self.task]

    def _no_culprit(self, candidate: str) -> str:
        """Why tensors are over tolerance but no op is named: the isolated errors all pass
        (each op is within tolerance on its own; the accumulated error builds up, and
        where it first exceeds tolerance is said), or only tensors not exactly related fail."""
        acc = [r for r in self.records if r.candidate == candidate and r.exact
               and r.mode == "accumulated" and not r.metrics.passed]
        if acc and self.isolated_available.get(candidate):
            r = min(acc, key=lambda r: r.order)
            tail = ""
            found = self._source(candidate)
            if found is not None:
                src, share, runner_up = found
                covers = f" covering {', '.join(src.covers)}" if src.covers else ""
                tail = (f"; it comes from {src.reference}{covers} ({src.op_type} {src.name}: "
                        f"isolated max abs {src.metrics.max_abs:.3g}, {share:.2g} of its "
                        f"tolerance; every other op before it at most {runner_up:.2g} of its own)")
            return (f"no op over tolerance on its own (isolated); the accumulated error first "
                    f"exceeds it at {r.reference} ({r.op_type} {r.name}, max abs "
                    f"{r.metrics.max_abs:.3g}): errors within tolerance before it grow "
                    f"past it{tail}")
        return "over tolerance only where not exactly related; no op named"

    def __str__(self) -> str:
        return self.summary()

    def rows(self, candidate: str | None = None, mode: str | None = None) -> list[dict]:
        """The records as table rows (``Record.as_dict``).

        Args:
            candidate: only this candidate's records (None: all).
            mode: only "accumulated" or "isolated" records (None: both).

        Returns:
            One dict per record, with the columns of ``COLUMNS`` and the metrics' other
            fields.
        """
        return [r.as_dict() for r in self.records
                if (candidate is None or r.candidate == candidate)
                and (mode is None or r.mode == mode)]

    def table(self, format: str = "records", candidate: str | None = None,
              mode: str | None = None) -> Any:
        """The records as a table.

        Args:
            format: "records" (a list of dicts), "csv" (text, the ``COLUMNS``) or "html"
                (a table, the first divergence's row marked).
            candidate: only this candidate's records (None: all).
            mode: only this mode's records (None: both).

        Returns:
            The rows in that format.

        Raises:
            InputError: an unknown format.
        """
        rows = self.rows(candidate, mode)
        if format == "records":
            return rows
        rows = [_shown(r) for r in rows]
        if format == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
            return buf.getvalue()
        if format == "html":
            first = self.first_divergence
            head = "".join(f"<th>{c}</th>" for c in COLUMNS)
            body = []
            for r in rows:
                cls = ' class="wb-first-divergence"' if first and (
                    r["candidate"], r["mode"], r["name"]) == (first.candidate, first.mode,
                                                              first.name) else ""
                cells = "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in COLUMNS)
                body.append(f"<tr{cls}>{cells}</tr>")
            return (f'<table class="wb-compare"><thead><tr>{head}</tr></thead>'
                    f"<tbody>{''.join(body)}</tbody></table>")
        raise InputError(f"table format {format!r} is not one of records, csv, html",
                         "report.table('csv')")

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.summary())}</pre>" + self._task_html() + \
            self.table("html")

    def _task_html(self) -> str:
        """The task scores as a table: candidate, task, score, the phrase ('' without)."""
        rows = "".join(f"<tr><td>{html.escape(r['candidate'])}</td><td>{html.escape(r['task'])}"
                       f"</td><td>{html.escape(self.task[r['candidate']].cell)}</td><td>"
                       f"{html.escape(r['text'])}</td></tr>" for r in self.task_rows())
        return (f'<table class="wb-task"><thead><tr><th>candidate</th><th>task</th><th>score'
                f"</th><th></th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""

    def plot(self, metric: str = "max_abs") -> Figures:
        """The figures: error along the graph (accumulated vs isolated, tolerance, first
        divergence marked) and error by op type; a notebook shows them as a cell's value.

        Args:
            metric: the metric plotted: max_abs, mean_abs, max_rel, cosine or snr_db.

        Returns:
            [error along the graph, error by op type]: matplotlib Figures (``Figures``).
        """
        from . import plots

        recs = self.rows()
        first = self.first_divergence
        mode = "accumulated" if any(r["mode"] == "accumulated" for r in recs) else "isolated"
        return Figures([plots.error_along_graph(recs, metric=metric,
                                                highlight=first.name if first else None),
                        plots.error_by_op_type(recs, metric=metric, mode=mode)])

    def plot_tensor(self, name: str, candidate: str | None = None, channel: int = 0
                    ) -> Figures:
        """One aligned tensor: histogram of |a - b|, heatmap of a channel, reference vs
        candidate scatter (both backends run again).

        Args:
            name: the candidate tensor's name (an aligned one).
            candidate: the candidate's name (None: the first).
            channel: the channel the heatmap shows.

        Returns:
            [histogram, heatmap or None (a tensor of fewer than 2 axes), scatter] (``Figures``).
        """
        import numpy as np

        from . import plots

        ref, cand = self.tensors(name, candidate)
        tol = next((r.metrics.tolerance for r in self.records if r.name == name), None)
        return Figures([plots.error_histogram(ref, cand, tolerance=tol),
                        plots.diff_heatmap(ref, cand, channel=channel) if min(
                            len(unbatched(np.shape(ref))), len(unbatched(np.shape(cand)))) >= 2
                        else None,
                        plots.ref_vs_cand_scatter(ref, cand)])

    # -- which layers cost a low-precision candidate most --------------------------------------
    def sensitivity(self, candidate: str | None = None,
                    progress: bool = True) -> Ranking:
        """Every exactly aligned layer of ``candidate`` (default: the one furthest from the
        reference) that ran in low precision, with the final-output SNR its own isolated
        error costs, most costly first (comparison/sensitivity.py). Needs mode "both" or
        "isolated"; computed once.

        Args:
            candidate: the candidate's name (None: the one furthest from the reference).
            progress: show a progress bar.

        Returns:
            A Ranking: the measured low-precision layers (Sensitivity: record, final-output
            SNR, isolated SNR), most costly first, with ``.floats`` (layers that ran in fp32,
            not ranked), ``.unmeasurable`` (with the reason), ``.input_rounding`` and
            ``.summary()``.
        """
        from .sensitivity import _pick, sensitivity

        name = _pick(self, candidate).name
        if name not in self._sensitivity:
            self._sensitivity[name] = sensitivity(self, name, progress)
        return self._sensitivity[name]

    def sensitive(self, k: int = 3, candidate: str | None = None) -> list[Record]:
        """The ``k`` records whose isolated error costs the final output most (the module in
        ``.reference``): what to keep in float, ``wb.quantize(..., exclude=rep.sensitive(k))``.

        Args:
            k: how many layers.
            candidate: the candidate's name (None: as ``sensitivity``).

        Returns:
            Up to ``k`` records, most costly first.

        Raises:
            InputError: ``k`` is not a positive int.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"sensitive(k={k!r}): expected a positive number of layers",
                             "e.g. rep.sensitive(3)")
        return [s.record for s in self.sensitivity(candidate)[:k]]

    def fp16_unsafe(self, candidate: str | None = None,
                    min_snr_db: float = DEFAULT_MIN_SNR_DB) -> Fp16Risks:
        """The layers of an fp16 ncnn candidate (an ARM target's fp16 arithmetic) whose own
        output overflows fp16 or falls under ``min_snr_db``, in graph order, each with its
        inputs' and output's range: ``wb.ncnn_featmask(nc, rep.fp16_unsafe().layers,
        fp16_arithmetic=False)`` keeps them in fp32 (comparison/fp16_risk.py).

        Args:
            candidate: the candidate's name (None: the first ncnn fp16 one).
            min_snr_db: the isolated SNR under which a layer is listed.

        Returns:
            Fp16Risks (a list of Fp16Risk, with ``.layers`` and ``.summary()``).

        Raises:
            InputError: no such fp16 candidate, or the comparison has no isolated run.
        """
        return fp16_unsafe(self, candidate, min_snr_db)

    def reference_values(self) -> dict[str, Any]:
        """Every reference tensor on the first input set: run again once, then kept."""
        if not self._reference_values:
            self._reference_values.update(self.reference.run(self.inputs, capture="all"))
        return self._reference_values

    # -- one tensor, again ------------------------------------------------------------------
    def tensors(self, name: str, candidate: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One aligned tensor's values, by running both again.

        Args:
            name: the candidate tensor's name (an aligned one).
            candidate: the candidate's name (None: the first).

        Returns:
            (reference array, candidate array).

        Raises:
            InputError: no such candidate, or ``name`` is not one of its aligned tensors.
        """
        cand = self._candidate(candidate)
        pairs = self.alignments[cand.name].pairs
        if name not in pairs:
            raise InputError(f"{name!r} is not an aligned tensor of {cand.name}",
                             f"aligned names: {list(pairs)[:8]}...")
        ref = self.reference.run(self.inputs, capture="all")[pairs[name]]
        # in the candidate's layout and scale, as it was measured
        ref = self.alignments[cand.name].as_candidate(name, ref)
        return ref, cand.runner.run(self.inputs, capture="all")[name]

    def _candidate(self, name: str | None) -> Candidate:
        name = self.candidates[0].name if name is None else name
        cand = next((c for c in self.candidates if c.name == name), None)
        if cand is None:
            raise InputError(f"no candidate {name!r}",
                             f"candidates: {[c.name for c in self.candidates]}")
        if cand.name in self.failed:
            raise InputError(f"candidate {cand.name!r} did not run: {self.failed[cand.name]}",
                             "nothing of it was measured; the report's other candidates were")
        return cand

    def repro(self, record: Record | None, folder: str | Path) -> Path:
        """Write a minimal ONNX model of the op, its reference inputs and expected output as
        .npy, and a script that reproduces the numbers.

        Args:
            record: the record to reproduce (e.g. ``report.first_divergence``) of an ONNX
                candidate.
            folder: where to write (created).

        Returns:
            The folder.

        Raises:
            InputError: no record, or a record of an ncnn candidate.
        """
        from .repro import write_repro

        if record is None:
            raise InputError("nothing to reproduce: no divergence given",
                             "pass report.first_divergence, or a record from report.records")
        cand = self._candidate(record.candidate)
        if cand.kind != "onnx":
            raise InputError(f"repro writes ONNX models; {cand.name} is {cand.kind}",
                             "compare the ONNX artifact too and reproduce its divergence")
        return write_repro(self, cand, record, Path(folder))

    def to_json(self) -> str:
        """The summary, aligned fractions, rows and task scores as JSON text."""
        return json.dumps({"summary": self.summary(), "aligned_fraction": self.aligned_fraction,
                           "records": self.rows(), "task": {r.pop("candidate"): r for r in
                                                            self.task_rows()}}, default=str)


def _bound(m: Any) -> str:
    """A record's tolerance in words: "1.2e-05 (4x its fp32 noise floor)" when its noise
    floor decided it, else the number (a tolerance given, a low precision's)."""
    from .noise_floor import FACTOR

    floor = getattr(m, "noise_floor", 0.0)
    if floor > 0 and m.tolerance == FACTOR * floor:
        return f"{m.tolerance:.3g}, {FACTOR:g}x its fp32 noise floor"
    return f"{m.tolerance:.3g}"


def _shown(row: dict) -> dict:
    """A row as the csv and html tables show it: no noise floor where none decided (a low
    precision's per-element rule, ``floor_basis`` empty): a blank cell, not 0."""
    return row if row.get("floor_basis") else {**row, "noise_floor": None}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
