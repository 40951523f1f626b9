"""Diagnostic: something a stage noticed, with a stable code and a hint (the bottom layer,
beside errors.py: every module may report one)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass
class Diagnostic:
    """Something a stage noticed: ``level`` info/warning/error, a stable ``code``, and a hint."""

    level: str
    code: str
    message: str
    hint: str = ""
    source: str | None = None  # "file.py:12" where the cause lives, when known

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnostic:
        return cls(**{k: d.get(k) for k in ("level", "code", "message", "hint", "source")
                      if k in d})

    def __str__(self) -> str:
        where = f" [{self.source}]" if self.source else ""
        hint = f"\n    hint: {self.hint}" if self.hint else ""
        return f"{self.level}: {self.code}{where}: {self.message}{hint}"


# -- a list of diagnostics as a reader wants it ---------------------------------------------
# The user's own problems first; the same warning said many times, and what libraries say
# about their own code (torch's constant folding, a deprecation inside torch, a tracer
# warning whose line is in transformers' source), one line each with a count.

_LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}
_PACKAGES = re.compile(r"^.*[/\\](?:site|dist)-packages[/\\]")


def short_source(source: str | None) -> str | None:
    """A source path without the interpreter's install prefix:
    '/…/site-packages/torch/onnx/utils.py:218' -> 'torch/onnx/utils.py:218'."""
    return _PACKAGES.sub("", source) if source else source


def is_library_internal(d: Diagnostic) -> bool:
    """True when the cause lies in an installed library's own code (its source is under
    site-packages/dist-packages): nothing the user can change in the model."""
    return bool(d.source) and _PACKAGES.match(d.source) is not None


@dataclass
class DiagnosticGroup:
    """Diagnostics that say the same thing (level, code, message), counted, with every
    site they came from (shortened)."""

    level: str
    code: str
    message: str
    hint: str
    sources: list[str]
    count: int
    internal: bool  # from a library's own code

    @property
    def package(self) -> str | None:
        """The library the (first) source lies in, e.g. 'torch', for an internal group."""
        if not self.internal or not self.sources:
            return None
        return re.split(r"[/\\.:]", self.sources[0], maxsplit=1)[0] or None

    def line(self) -> str:
        """One line: level, code, count, where, message (its first line)."""
        times = f" ×{self.count}" if self.count > 1 else ""
        where = f" [{', '.join(self.sources[:2])}{', …' if len(self.sources) > 2 else ''}]" \
            if self.sources else ""
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.level}: {self.code}{times}{where}: {first}"


@dataclass
class DiagnosticsView:
    """Diagnostics grouped for reading: ``own`` (the user's problems, errors first) and
    ``internal`` (library-internal, one group per message)."""

    own: list[DiagnosticGroup]
    internal: list[DiagnosticGroup]

    @property
    def total(self) -> int:
        return sum(g.count for g in self.own + self.internal)


def group_diagnostics(diags: list[Diagnostic]) -> DiagnosticsView:
    """Group ``diags``: equal (level, code, message) collapse into one group with a count;
    a group is internal when every one of its sites is inside an installed library. Own
    groups are ordered by level (error, warning, info), then as they came."""
    groups: dict[tuple[str, str, str, bool], DiagnosticGroup] = {}
    for d in diags:
        internal = is_library_internal(d)
        key = (d.level, d.code, d.message, internal)
        g = groups.get(key)
        if g is None:
            g = groups[key] = DiagnosticGroup(d.level, d.code, d.message, d.hint or "", [],
                                              0, internal)
        g.count += 1
        src = short_source(d.source)
        if src and src not in g.sources:
            g.sources.append(src)
    ordered = list(groups.values())
    own = sorted((g for g in ordered if not g.internal),
                 key=lambda g: _LEVEL_ORDER.get(g.level, 3))
    internal = [g for g in ordered if g.internal]
    return DiagnosticsView(own, internal)
