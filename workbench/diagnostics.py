"""Diagnostic: something a stage noticed, with a stable code and a hint (the bottom layer,
beside errors.py: every module may report one)."""

from __future__ import annotations

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
