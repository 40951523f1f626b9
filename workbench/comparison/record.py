"""Record: one aligned tensor of one candidate in one mode, with its metrics (a row of a
CompareReport; its own module so the steps that make records need not import the report)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .metrics import TensorMetrics


@dataclass
class Record:
    """One aligned tensor of one candidate in one mode, with its metrics."""

    candidate: str
    mode: str
    order: int
    name: str
    reference: str
    op_type: str
    metrics: TensorMetrics
    relation: str = "equal"  # how the candidate tensor relates to the reference tensor
    covers: tuple[str, ...] = ()  # the reference records a folded tensor spans
    node: str = ""  # the candidate's node (ONNX) or layer (ncnn) that wrote it

    @property
    def exact(self) -> bool:
        """Related to its reference tensor exactly (equal, or equal up to a known folding or
        a reshape): its error is the op's own, so it may be named as a divergence."""
        return self.relation.startswith("equal")

    def as_dict(self) -> dict[str, Any]:
        """The record as a table row: its fields and its metrics' (``TensorMetrics.as_dict``)."""
        return {"candidate": self.candidate, "mode": self.mode, "order": self.order,
                "name": self.name, "reference": self.reference, "op_type": self.op_type,
                **self.metrics.as_dict(), "relation": self.relation}
