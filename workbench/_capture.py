"""Capture what torch and native libraries print or warn while a stage runs.

Python warnings are recorded with their category, file and line; text written to the
process's stdout/stderr file descriptors (C++ logging, torch's logger) is captured at the
fd level so it lands in diagnostics instead of the kernel's terminal.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Captured:
    warnings: list[warnings.WarningMessage] = field(default_factory=list)
    output: str = ""

    def lines(self) -> list[str]:
        return [ln for ln in self.output.splitlines() if ln.strip()]


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - trivial
        self.sink.append(f"{record.levelname[0]} {record.name}: {record.getMessage()}")


def _fd_ok(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def capture(fd_level: bool = True) -> Iterator[Captured]:
    """Record warnings, logging from torch/onnx, and stdout/stderr (fd-level) into a Captured."""
    cap = Captured()
    log_lines: list[str] = []
    handler = _ListHandler(log_lines)
    roots = ("torch", "onnxscript", "onnx_ir", "onnxslim")
    # child loggers with handlers of their own (torch.onnx has one) are swapped too
    names = set(roots) | {n for n, lg in logging.root.manager.loggerDict.items()
                          if n.startswith(tuple(r + "." for r in roots))
                          and isinstance(lg, logging.Logger) and lg.handlers}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    saved_prop = [(lg, lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:  # only our handler while capturing, so each line is recorded once
        lg.handlers[:] = [handler]
        lg.propagate = False
    py_out, py_err = io.StringIO(), io.StringIO()
    saved_fds: list[tuple[int, int]] = []
    tmp = None
    if fd_level and _fd_ok(1) and _fd_ok(2):
        tmp = tempfile.TemporaryFile(mode="w+b")
        for fd in (1, 2):
            with contextlib.suppress(Exception):
                (sys.stdout if fd == 1 else sys.stderr).flush()
            saved_fds.append((fd, os.dup(fd)))
            os.dup2(tmp.fileno(), fd)
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                yield cap
        cap.warnings = list(rec)
    finally:
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)
        native = ""
        if tmp is not None:
            tmp.seek(0)
            native = tmp.read().decode("utf-8", "replace")
            tmp.close()
        for lg, prop, handlers in saved_prop:
            lg.propagate = prop
            lg.handlers[:] = handlers
        cap.output = "\n".join(x for x in (py_out.getvalue(), py_err.getvalue(), native, *log_lines) if x)
