"""wb.compare given a partition (``wb.partition``'s answer) among its candidates.

A part's artifacts compute its span of the model from the values at its input boundary,
so each is compared op by op against the part's own torch span (``part.torch``) fed the
torch model's values there: an error is found in the part that makes it, not in the parts
it flows into. The chain of parts in each backend is checked against the whole torch model
by ``compare_parts`` (parts.py), and its result is part of the report: ``ok`` needs every
chain within tolerance too, and ``summary()`` ends with a line per chain. A part cut from
an ONNX model has no torch span: only its chain is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..stages.partition_parts import Partition
from .candidates import input_sets
from .measure import Tolerances
from .parts import PartsReport, compare_parts
from .report import CompareReport, Record


def split_partitions(candidates: Any) -> tuple[list[Partition], Any]:
    """(the partitions among ``candidates``, the other candidates); ``candidates`` is
    returned as it came when it holds no partition."""
    items = candidates if isinstance(candidates, (list, tuple)) else [candidates]
    found = [c for c in items if isinstance(c, Partition)]
    if not found:
        return [], candidates
    return found, [c for c in items if not isinstance(c, Partition)]


@dataclass
class PartitionCheck:
    """One partition compared: ``chain`` the chain of parts in each backend against the
    whole torch model and each part's outputs against its span (``compare_parts``);
    ``reports`` {part name: its CompareReport}, op by op, for the parts that have an
    artifact and a torch span; ``parts`` {candidate name: part name}."""

    partition: Partition
    chain: PartsReport
    reports: dict[str, CompareReport] = field(default_factory=dict)
    parts: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Which candidate is which part, what stays in torch, then the chains."""
        out = []
        for part in self.partition.parts:
            mine = [c for c, p in self.parts.items() if p == part.name]
            kept = [f"{b}: torch ({why})" for b, why in part.in_torch.items()]
            if part.torch is None and part.artifacts:
                kept.append("cut from ONNX: no torch span, its chain checked only")
            out.append(f"partition {part.name} ({', '.join(part.inputs)} -> "
                       f"{', '.join(part.outputs)}): " + "; ".join(mine + kept))
        return out + [f"partition {line}" for line in self.chain.summary().splitlines()]


@dataclass
class PartitionedReport(CompareReport):
    """A CompareReport over the plain candidates and every part's artifacts (each measured
    against its part's torch span, named by its artifact as any candidate), with
    ``partitions`` (PartitionCheck: the chains and each part's own report). What re-runs a
    candidate (``tensors``, ``plot_tensor``, ``repro``, ``sensitivity``, ``fp16_unsafe``)
    asks the report the candidate was measured in, whose reference is its part's span."""

    partitions: list[PartitionCheck] = field(default_factory=list)
    _owners: dict[str, CompareReport] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Every candidate's comparison is ok (as ``CompareReport.ok``) and every chain of
        parts is within tolerance of the whole torch model."""
        return super().ok and all(p.chain.ok for p in self.partitions)

    @property
    def first_divergence(self) -> Record | None:
        """A plain candidate's first divergence, else the first part's (in part order)."""
        found = list(self.divergences().values())
        plain = [r for r in found if r.candidate not in self._owners]
        if plain or not found:
            return min(plain, key=lambda r: r.order) if plain else None
        rank = {c: i for i, c in enumerate(self._owners)}
        return min(found, key=lambda r: (rank[r.candidate], r.order))

    def summary(self) -> str:
        """CompareReport's lines for every candidate, then each partition's: which
        candidate is which part, the parts left in torch and the chain in each backend."""
        lines = [super().summary()] if self.candidates else [
            "NOT OK: no part runs on a backend (every part stays in torch): nothing compared "
            "op by op"]
        return "\n".join(lines + [ln for p in self.partitions for ln in p.lines()])

    def _owner(self, candidate: str | None) -> CompareReport | None:
        """The report a part's candidate was measured in (None: a plain candidate's)."""
        return self._owners.get(candidate) if candidate is not None else None

    def tensors(self, name: str, candidate: str | None = None) -> Any:
        candidate = candidate or (self.candidates[0].name if self.candidates else None)
        owner = self._owner(candidate)
        return owner.tensors(name, candidate) if owner else super().tensors(name, candidate)

    def sensitivity(self, candidate: str | None = None, progress: bool = True) -> Any:
        from .sensitivity import _pick

        candidate = _pick(self, candidate).name
        owner = self._owner(candidate)
        return owner.sensitivity(candidate, progress) if owner else \
            super().sensitivity(candidate, progress)

    def fp16_unsafe(self, candidate: str | None = None, **kw: Any) -> Any:
        owner = self._owner(candidate)
        return owner.fp16_unsafe(candidate, **kw) if owner else \
            super().fp16_unsafe(candidate, **kw)

    def repro(self, record: Record | None, folder: Any) -> Any:
        owner = self._owner(record.candidate if record is not None else None)
        return owner.repro(record, folder) if owner else super().repro(record, folder)

    def to_json(self) -> str:
        import json

        data = json.loads(super().to_json())
        data["partitions"] = [{"lines": p.lines(), "ok": p.chain.ok, "rows": p.chain.table()}
                              for p in self.partitions]
        return json.dumps(data, default=str)


def compare_partitioned(compare: Callable[..., CompareReport], reference: Any,
                        partitions: list[Partition], others: list, inputs: Any,
                        options: dict[str, Any]) -> PartitionedReport:
    """``compare`` (compare.py's, on plain candidates) over ``others`` and over each part's
    artifacts against its span, and ``compare_parts`` over each partition; one report.
    ``options`` are compare()'s keywords; a task metric scores the plain candidates only
    (a part's outputs are not the model's answer)."""
    _check_options(options)
    main = compare(reference, others, inputs, **options) if others else None
    checks = [_check_partition(compare, reference, p, inputs, options) for p in partitions]
    return _merge(main, checks, reference, inputs, options)


def _check_options(options: dict[str, Any]) -> None:
    """compare()'s mode and tolerance checked before any part runs (InputError)."""
    from .plan import MODES

    if options["mode"] not in MODES:
        raise InputError(f"mode={options['mode']!r} is not one of {MODES}",
                         "'accumulated', 'isolated' or 'both'")
    Tolerances.of(options["tolerance"], None, None)


def _check_partition(compare: Callable[..., CompareReport], reference: Any,
                     partition: Partition, inputs: Any, options: dict[str, Any]
                     ) -> PartitionCheck:
    """Each part with artifacts against its span on the torch values at its boundary (per
    input set), then the chains (the worst over the input sets)."""
    import torch

    sets = input_sets(inputs)
    bounds = [partition.boundaries(args) for args in sets]
    sub = {**options, "task": None}
    check = PartitionCheck(partition, _worst([
        compare_parts(reference, partition, args, **_atol_rtol(options["tolerance"]))
        for args in sets]))
    for k, part in enumerate(partition.parts):
        if not part.artifacts or part.torch is None:
            continue
        part_sets = [tuple(torch.as_tensor(v) for v in b[k]) for b in bounds]
        rep = compare(part.torch, list(part.artifacts.values()),
                      part_sets if len(part_sets) > 1 else part_sets[0], **sub)
        check.reports[part.name] = rep
        check.parts.update({c.name: part.name for c in rep.candidates})
    return check


def _atol_rtol(tolerance: Any) -> dict[str, float]:
    base = Tolerances.of(tolerance, None, None).base
    return {"atol": base.atol, "rtol": base.rtol}


def _worst(reports: list[PartsReport]) -> PartsReport:
    """One PartsReport: each chain and part at its worst over the input sets."""
    if len(reports) == 1:
        return reports[0]

    def worst(rows: tuple) -> Any:
        return max(rows, key=lambda r: (not r.ok, r.max_abs))

    first = reports[0]
    return PartsReport([worst(c) for c in zip(*(r.chains for r in reports), strict=True)],
                       [worst(p) for p in zip(*(r.parts for r in reports), strict=True)],
                       first.atol, first.rtol)


def _merge(main: CompareReport | None, checks: list[PartitionCheck], reference: Any,
           inputs: Any, options: dict[str, Any]) -> PartitionedReport:
    """One report: the plain candidates' (``main``) and every part's, merged by candidate."""
    from ..runtime import runner_for

    reports = ([main] if main is not None else []) + [r for c in checks
                                                     for r in c.reports.values()]
    owners = {cand.name: rep for c in checks for rep in c.reports.values()
              for cand in rep.candidates}
    base = main or (reports[0] if reports else None)
    merged: dict[str, Any] = {key: {} for key in ("alignments", "isolated_available",
                                                  "unmeasured", "notes", "failed", "task")}
    for rep in reports:
        for key, into in merged.items():
            into.update(getattr(rep, key))
    return PartitionedReport(
        records=[r for rep in reports for r in rep.records],
        candidates=[c for rep in reports for c in rep.candidates],
        tolerance=base.tolerance if base else Tolerances.of(options["tolerance"], None,
                                                            None).base,
        inputs=base.inputs if main else input_sets(inputs)[0],
        reference=main.reference if main else runner_for(reference),
        min_explained=options["min_explained"], partitions=checks, _owners=owners, **merged)
