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
