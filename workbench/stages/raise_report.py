"""RaiseReport: what ``raise_ops`` did (which rule fired where, node names before -> op after,
counts and op histograms, drift against the parent), written as ``raise_report.json`` beside
the raised model and read back with ``RaiseReport.of(artifact)``."""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..artifact.record import Artifact
from ..errors import InputError
from .rewrite import Firing

REPORT = "raise_report.json"


@dataclass
class RaiseReport:
    """What ``raise_ops`` did: firings, counts and op histograms before/after, drift vs parent."""

    target: str
    opset_before: int | None
    opset_after: int | None
    firings: list[Firing] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    max_abs_vs_parent: float | None = None
    max_rel_vs_parent: float | None = None  # element-wise (|diff| / (|ref| + 1e-6)), worst
    rel_vs_parent: float | None = None  # max abs diff / max |parent output|: the 1e-5 figure
    # rule -> the opset its standard op needs (None: the op exists but cannot express a match)
    fallbacks: dict[str, int | None] = field(default_factory=dict)
    disabled: list[str] = field(default_factory=list)  # rules dropped by the numeric check

    @property
    def counts(self) -> dict[str, int]:
        """How many times each rule fired."""
        return dict(Counter(f.rule for f in self.firings))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RaiseReport:
        d = dict(d)
        d["firings"] = [Firing(**f) for f in d.get("firings", [])]
        return cls(**d)

    @classmethod
    def of(cls, artifact: Artifact) -> RaiseReport:
        """The report of a raise artifact (read from its ``raise_report.json``)."""
        path = artifact.dir / REPORT if isinstance(artifact, Artifact) else None
        if path is None or artifact.stage != "raise" or not path.is_file():
            what = (f"artifact {artifact.id} from stage {artifact.stage!r}"
                    if isinstance(artifact, Artifact) else type(artifact).__name__)
            raise InputError(f"RaiseReport.of takes an artifact from wb.raise_ops, got {what}",
                             "pass the artifact raise_ops returned")
        return cls.from_dict(json.loads(path.read_text()))

    def summary(self) -> str:
        """One line: nodes before -> after, what fired, drift."""
        fired = ", ".join(f"{k} x{v}" for k, v in self.counts.items()) or "nothing fired"
        err = (f", max abs {self.max_abs_vs_parent:.3g} vs parent"
               if isinstance(self.max_abs_vs_parent, float) else "")
        return f"raise ({self.target}): {self.nodes_before} -> {self.nodes_after} nodes; {fired}{err}"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(f.rule)}</td><td>{f.form}</td>"
            f"<td>{html.escape(', '.join(f.nodes_before))}</td>"
            f"<td>{html.escape('+'.join(f.ops_before))}</td>"
            f"<td>{html.escape(f.node_after)}</td><td>{html.escape(f.op_after)}</td></tr>"
            for f in self.firings)
        head = ("<tr><th>rule</th><th>form</th><th>nodes before</th><th>ops before</th>"
                "<th>node after</th><th>op after</th></tr>")
        notes = "".join(f"<br>{html.escape(line.strip())}" for line in str(self).splitlines()
                        if "function form" in line or "disabled" in line)
        return (f"<b>{html.escape(self.summary())}</b>{notes}"
                f"<table>{head}{rows}</table>")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  {f}" for f in self.firings]
        for rule, op in self.fallbacks.items():
            why = f"the standard op needs opset {op}" if op else "no standard op for some"
            lines.append(f"  {rule}: function form ({why})")
        for rule in self.disabled:
            lines.append(f"  {rule}: disabled (the raised model did not match its parent)")
        return "\n".join(lines)
