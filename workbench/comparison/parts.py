"""Comparing a partition: the chain of parts against the whole torch model, and each part
against its torch span on the torch values at its boundary (so a part's own error is told
from what the parts before it passed on).

``compare_parts`` checks the chain and each part's outputs; for each backend of the
partition it runs the chain (parts a backend did not take run in torch) and every part
alone. ``wb.compare(model, [parts], inputs)`` calls it for a partition among its candidates
and adds each part's op-by-op comparison against its torch span (partitioned.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..inputs import as_tensor_tuple, run_torch
from ..stages.partition_spans import evaluating
from ..tolerances import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerance, max_errors, within


@dataclass(frozen=True)
class PartCheck:
    """One part in one backend, fed the torch values at its input boundary: ``ran`` says
    what ran it (the backend, or "torch" where it stays in torch); ``max_abs`` its largest
    error against its torch span's outputs; ``ok`` within atol + rtol x max |torch|."""

    part: str
    backend: str
    ran: str
    max_abs: float
    ok: bool


@dataclass(frozen=True)
class ChainCheck:
    """The chain of parts in one backend against the whole torch model: ``ran`` per part."""

    backend: str
    ran: tuple[str, ...]
    max_abs: float
    ok: bool


@dataclass
class PartsReport:
    """Every chain and every part, compared; ``ok`` when all are within tolerance."""

    chains: list[ChainCheck] = field(default_factory=list)
    parts: list[PartCheck] = field(default_factory=list)
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL

    @property
    def ok(self) -> bool:
        return bool(self.chains) and all(c.ok for c in self.chains + self.parts)

    def first_bad(self, backend: str) -> PartCheck | None:
        """The first part whose own error breaks tolerance in ``backend`` (None if none)."""
        return next((p for p in self.parts if p.backend == backend and not p.ok), None)

    def summary(self) -> str:
        """One line per chain: its error, what ran each part, and the first part at fault."""
        lines = []
        for c in self.chains:
            bad = self.first_bad(c.backend)
            lines.append(f"{c.backend}: chain {' -> '.join(c.ran)} vs torch: max abs "
                         f"{c.max_abs:.3g} {'ok' if c.ok else 'NOT OK'}"
                         + (f"; first part past tolerance: {bad.part} ({bad.max_abs:.3g})"
                            if bad else ""))
        return "\n".join(lines)

    def table(self) -> list[dict[str, Any]]:
        """Rows: each part in each backend, then each chain."""
        rows = [{"what": p.part, "backend": p.backend, "ran": p.ran, "max_abs": p.max_abs,
                 "ok": p.ok} for p in self.parts]
        return rows + [{"what": "chain", "backend": c.backend, "ran": " -> ".join(c.ran),
                        "max_abs": c.max_abs, "ok": c.ok} for c in self.chains]


def compare_parts(model: Any, partition: Any, inputs: Any, *, atol: float = DEFAULT_ATOL,
                  rtol: float = DEFAULT_RTOL) -> PartsReport:
    """The chain of ``partition``'s parts against ``model``, and each part against its span.

    Args:
        model: the whole torch model (None for a partition of an ONNX model: the whole
            ONNX model's outputs are the reference then).
        partition: what ``wb.partition`` returned.
        inputs: the model's inputs.
        atol, rtol: an output passes when max |torch - got| <= atol + rtol x max |torch|.

    Returns:
        A PartsReport: ``chains`` (per backend), ``parts`` (per part and backend), ``ok``,
        ``summary()``, ``table()``, ``first_bad(backend)``.

    Example:
        ``rep = wb.compare_parts(model, parts, (x,)); print(rep.summary())``
    """
    atol, rtol = check_tolerance(atol, rtol, "compare_parts")
    if not hasattr(partition, "parts") or not hasattr(partition, "boundaries"):
        raise InputError(f"compare_parts: expected what wb.partition returned, got "
                         f"{type(partition).__name__}", "parts = wb.partition(model, (x,), "
                         "at=[...]); wb.compare_parts(model, parts, (x,))")
    args = as_tensor_tuple(inputs)
    values = partition.boundaries(args)
    if model is None:
        whole = values[-1]
    else:
        with evaluating(model):  # run_torch sets eval mode: the user's modes put back after
            whole = run_torch(model, args, "inputs")
    rep = PartsReport(atol=atol, rtol=rtol)
    for backend in partition.backends:
        chain = partition.run(args, backend)
        rep.chains.append(ChainCheck(backend, tuple(p.runs_on(backend) for p in partition.parts),
                                     *_error(whole, chain, atol, rtol)))
        for k, part in enumerate(partition.parts):
            got = part.run(values[k], backend)
            rep.parts.append(PartCheck(part.name, backend, part.runs_on(backend),
                                       *_error(values[k + 1], got, atol, rtol)))
    return rep


def _error(ref: list, got: list, atol: float, rtol: float) -> tuple[float, bool]:
    errors = max_errors(ref, got)
    return errors["max_abs"], within(errors, atol, rtol, ref)
