"""Errors the workbench raises: each names the input, what was expected and what came, and a hint."""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base of every workbench error; ``hint`` says what to do next."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message

    def cause_line(self) -> str:
        """The innermost chained exception in one line ('' without one, or when the message
        already quotes it): what went wrong under the workbench's words."""
        root, seen = self, set()
        while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
            seen.add(id(root))
            root = nxt
        if root is self:
            return ""
        first = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), "")
        if first and first in self.message:
            return ""
        return f"{type(root).__name__}: {first}"[:300]

    def advice_lines(self) -> list[str]:
        """What a notebook shows first: the message, the hint and the cause's one line."""
        lines = [f"{type(self).__name__}: {self.message}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        if cause := self.cause_line():
            lines.append(f"cause: {cause}")
        return lines

    def _render_traceback_(self) -> list[str]:
        """IPython's hook (its shell calls it for an exception that defines it, also for
        %tb): the advice leads and the full traceback follows under a rule, so the message
        and hint are the first lines a notebook shows and nothing of the traceback is lost."""
        import sys
        import traceback

        red, green, dim, off = "\x1b[1;31m", "\x1b[32m", "\x1b[2m", "\x1b[0m"
        head = self.advice_lines()
        out = [f"{red}{head[0]}{off}"]
        out += [f"{green}{ln}{off}" if ln.startswith("hint: ") else ln for ln in head[1:]]
        out.append(f"{dim}── full traceback (for a bug report; the advice is above) ──{off}")
        try:  # IPython's coloured traceback when running under it, else the plain one
            shell = sys.modules["IPython"].get_ipython()
            tb = shell.InteractiveTB.structured_traceback(type(self), self,
                                                          self.__traceback__)
        except Exception:  # noqa: BLE001 - any failure falls back to the stdlib's format
            tb = traceback.format_exception(type(self), self, self.__traceback__)
        return out + [ln.rstrip("\n") for ln in tb]

    def _repr_html_(self) -> str:
        """The same advice as HTML, the traceback folded in a <details> (for display(err))."""
        import html
        import traceback

        head = self.advice_lines()
        rows = [f"<div><b>{html.escape(head[0])}</b></div>"]
        rows += [f"<div>{html.escape(ln)}</div>" for ln in head[1:]]
        tb = "".join(traceback.format_exception(type(self), self, self.__traceback__))
        rows.append(f"<details><summary>traceback</summary><pre>{html.escape(tb)}</pre>"
                    "</details>")
        return "<div class='wb-error'>" + "".join(rows) + "</div>"


class InputError(WorkbenchError, ValueError):
    """An argument given to a stage is not what the stage needs."""


class ModelFileError(WorkbenchError, ValueError):
    """A model file is missing, not ONNX, or truncated."""


class WorkspaceError(WorkbenchError, OSError):
    """The workspace folder cannot be created or written."""


class ManifestError(WorkbenchError):
    """The workspace manifest is missing or corrupt and could not be rebuilt."""


class ExportError(WorkbenchError):
    """torch -> ONNX export failed (unsupported op, exporter error)."""


class SimplifyError(WorkbenchError):
    """A simplification backend failed; the input artifact is left intact."""


class ConversionError(WorkbenchError):
    """pnnx/ncnn conversion failed; the message carries the tail of the pnnx log."""


class MissingOpError(WorkbenchError):
    """A backend has no implementation of an op the model uses (a custom domain, a layer)."""


class BackendCrashed(WorkbenchError):
    """The worker process running a native backend died (segfault, abort, SIGFPE...)."""

    def __init__(self, message: str, hint: str = "", *, backend: str = "",
                 signal_name: str | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint)
        self.backend = backend
        self.signal = signal_name
        self.log_tail = log_tail


class BackendTimeout(WorkbenchError):
    """The worker running a native backend stalled (stopped, or no progress) or did not
    answer within the call's timeout; it was replaced by a fresh one."""


class RemoteError(WorkbenchError):
    """An ordinary Python error raised inside the worker, carried back by type name
    (``kind``)."""

    def __init__(self, message: str, hint: str = "", *, kind: str = "") -> None:
        super().__init__(message, hint)
        self.kind = kind


class CustomOpError(WorkbenchError, ValueError):
    """A custom-op declaration or registration is not usable as given."""


class RaiseError(WorkbenchError):
    """Raising failed (an opset upgrade the converter refuses, a rule that crashes)."""


class RunError(WorkbenchError):
    """A backend loaded the model but failed to run it on the given inputs."""


class NcnnRunError(RunError):
    """ncnn failed to run a layer on the given inputs (an extract returned an error, or a
    blob of invalid size); the message names the layer, its input shapes and ncnn's words."""


class OrtRunError(RunError):
    """onnxruntime failed inside a node on the given inputs (an index out of range, shapes
    that do not meet); the message names the node and onnxruntime's words."""


class QuantizationError(WorkbenchError):
    """ONNX Runtime's quantizer failed, or its output is not quantized as reported (it
    quantized nothing, or a node asked to stay float came out quantized)."""


class ResourceError(WorkbenchError):
    """This machine lacks the memory or the disk space a piece of work needs; the message
    names the files or folder, the bytes needed and the bytes there (see capacity.py)."""

    def __init__(self, message: str, hint: str = "", *, need: int | None = None,
                 available: int | None = None) -> None:
        super().__init__(message, hint)
        self.need = need
        self.available = available


class NotEnoughMemory(ResourceError):
    """A model's files say that loading it (a session, a comparison) needs more memory than
    this process may take; raised before anything is loaded. ``files``: the model's files."""

    def __init__(self, message: str, hint: str = "", *, need: int | None = None,
                 available: int | None = None, files: list[str] | None = None) -> None:
        super().__init__(message, hint, need=need, available=available)
        self.files = list(files or [])


class NotEnoughDisk(ResourceError, OSError):
    """A folder has not the space for what is (or would be) written there (ENOSPC, a quota,
    ulimit -f); nothing half written is kept. ``folder``, ``need`` and ``free`` in bytes."""

    def __init__(self, message: str, hint: str = "", *, folder: str = "",
                 need: int | None = None, free: int | None = None) -> None:
        super().__init__(message, hint, need=need, available=free)
        self.folder = folder
        self.free = free
