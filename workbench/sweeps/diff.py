"""What changed between two sweeps: per cell and stage, what broke, what improved, which error
grew, and which tool versions moved (e.g. after a dependency upgrade)."""

from __future__ import annotations

from dataclasses import dataclass

from .cell import BAD
from .db import CellRecord

GREW = 10.0  # an error this many times its earlier value counts as a change
SNR_MOVED = 3.0  # an int8 SNR this many dB from its earlier value (half or double the noise)


@dataclass(frozen=True)
class Change:
    """One stage of one cell that differs between the earlier sweep and this one."""

    model: str
    label: str
    stage: str
    kind: str  # "broke", "improved", "error grew", "error shrank", "snr fell", "snr rose",
    # "new", "gone"
    before: str
    after: str


@dataclass
class SweepDiff:
    changes: list[Change]
    tools: dict[str, tuple[str, str]]  # tool -> (before, after), only the ones that moved

    @property
    def broke(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "broke"]

    @property
    def improved(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "improved"]


def diff(before: list[CellRecord], after: list[CellRecord]) -> SweepDiff:
    """Cells are matched by model name and choices, stages by name."""
    old = {(c.name, c.label): c for c in before}
    new = {(c.name, c.label): c for c in after}
    changes: list[Change] = []
    for key, cell in new.items():
        prev = old.get(key)
        if prev is None:
            changes.append(Change(*key, "", "new", "", cell.status))
            continue
        prev_stages = {s.stage: s for s in prev.stages}
        for s in cell.stages:
            p = prev_stages.get(s.stage)
            if p is None:
                continue
            if (p.status in BAD) != (s.status in BAD):
                kind = "broke" if s.status in BAD else "improved"
                changes.append(Change(*key, s.stage, kind, _state(p), _state(s)))
            elif p.max_abs and s.max_abs and (s.max_abs > GREW * p.max_abs
                                              or p.max_abs > GREW * s.max_abs):
                kind = "error grew" if s.max_abs > p.max_abs else "error shrank"
                changes.append(Change(*key, s.stage, kind, f"{p.max_abs:.3g}",
                                      f"{s.max_abs:.3g}"))
            elif (getattr(p, "snr_db", None) is not None and s.snr_db is not None
                  and abs(s.snr_db - p.snr_db) >= SNR_MOVED):
                kind = "snr fell" if s.snr_db < p.snr_db else "snr rose"
                changes.append(Change(*key, s.stage, kind, f"{p.snr_db:.1f} dB",
                                      f"{s.snr_db:.1f} dB"))
    changes += [Change(*key, "", "gone", c.status, "") for key, c in old.items()
                if key not in new]
    return SweepDiff(changes, _tool_moves(before, after))


def tools_of(cells: list[CellRecord]) -> dict[str, str]:
    """Tool -> version(s) the cells ran with (several joined by ' / ')."""
    seen: dict[str, list[str]] = {}
    for c in cells:
        for s in c.stages:
            for tool, version in (s.tools or {}).items():
                if version not in seen.setdefault(tool, []):
                    seen[tool].append(version)
    return {k: " / ".join(v) for k, v in sorted(seen.items())}


def _tool_moves(before: list[CellRecord], after: list[CellRecord]) -> dict[str, tuple[str, str]]:
    a, b = tools_of(before), tools_of(after)
    return {k: (a.get(k, "-"), b.get(k, "-")) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)}


def _state(s: object) -> str:
    status = getattr(s, "status", "")
    err = getattr(s, "error_class", "")
    return f"{status} ({err})" if err and status in BAD else status
