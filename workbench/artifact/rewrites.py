"""RewriteRecord: what an artifact keeps of the rewriters that fired while it was exported.

``wb.export`` and ``wb.to_ncnn`` apply the registered rewriters (``wb.rewrite``,
``wb.rewrite_module``; ``wb.register_symbolic`` is listed beside them) whose conditions
match; each one that fired is one record in ``Artifact.rewrites`` (and in ``artifact.json``
under ``rewrites``), with how often it ran and, when Python could read it, its source, so
"Show code" can write it before the export call it changed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RewriteRecord:
    """One rewriter that fired during one export.

    ``kind`` is "function" (``wb.rewrite``), "module" (``wb.rewrite_module``) or "symbolic"
    (``wb.register_symbolic``); ``calls`` is how often it ran in one forward on the example
    inputs (for a symbolic: how many nodes the TorchScript exporter converted with it; None
    under the dynamo exporter, which is not counted); ``source`` is its Python source when
    readable (None for the workbench's own, ``builtin``, and for a symbolic, whose
    registration the custom-ops panel writes).
    """

    name: str
    kind: str
    target: str
    backend: str | None = None
    exporter: str | None = None
    opset: str | None = None
    calls: int | None = None
    builtin: bool = False
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewriteRecord:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})

    def line(self) -> str:
        """``name  kind target  [backend=..., exporter=...]  N call(s)`` in one line."""
        where = ", ".join(f"{k}={v}" for k, v in (("backend", self.backend),
                                                   ("exporter", self.exporter),
                                                   ("opset", self.opset)) if v)
        calls = "" if self.calls is None else f"  {self.calls} call(s)"
        return f"{self.name}  {self.kind} {self.target}" + (f"  [{where}]" if where else "") \
            + calls


def code_lines(records: list[RewriteRecord]) -> list[str]:
    """What "Show code" writes before an export that these rewriters changed: a comment per
    rewriter, then the source of each user rewriter (its decorator included), so the code
    registers them before it exports. The workbench's own need no code: they apply by
    themselves."""
    if not records:
        return []
    lines = ["# rewriters that fired in this export (applied during export only):"]
    lines += [f"#   {r.line()}" + ("  (shipped with the workbench)" if r.builtin else "")
              for r in records]
    sources = [r.source.rstrip("\n") for r in records if r.source and not r.builtin]
    if sources:
        lines.append("import torch")
    for source in sources:
        lines += [source, ""]
    return lines
