"""Progress within a long stage (pnnx's passes, quantization's calibration), step by step.

A stage function's ``progress`` is ``True`` (a tqdm.auto bar: a console line, or a widget in
a notebook), ``False`` (nothing) or a callable that receives a ``Step`` at each phase and
count: what a notebook panel draws in its own progress bar instead of a second bar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """Where a stage is: ``done`` of ``total`` steps, ``phase`` says what runs now."""

    stage: str  # "ncnn", "quantize", "compare"
    phase: str  # e.g. "pnnx pass_level2", "calibrating: 8 samples (minmax)"
    done: int
    total: int


OnStep = Callable[[Step], None]
Progress = bool | OnStep


class Steps:
    """One stage's progress: a tqdm.auto bar (``progress=True``), a callback, or nothing."""

    def __init__(self, progress: Progress, stage: str, total: int) -> None:
        from tqdm.auto import tqdm

        self.stage, self.total, self.done, self.phase_text = stage, total, 0, ""
        self.fn: OnStep | None = progress if callable(progress) else None
        self.bar: Any = tqdm(total=total, desc=stage, leave=False,
                             disable=self.fn is not None or not progress)

    def phase(self, text: str) -> None:
        """A new phase starts (the count stays)."""
        self.phase_text = text
        self.bar.set_postfix_str(text)
        self._report()

    def advance(self, n: int = 1) -> None:
        """``n`` more steps are done."""
        self.done = min(self.total, self.done + n)
        self.bar.update(n)
        self._report()

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _report(self) -> None:
        if self.fn is not None:
            self.fn(Step(self.stage, self.phase_text, self.done, self.total))
