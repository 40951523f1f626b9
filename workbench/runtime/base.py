"""The Runner interface shared by every backend.

``run(inputs, capture)`` checks the inputs against ``describe()`` in this process, then runs
the backend here (``isolated=False``) or in the crash-isolated worker (``isolated=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BackendCrashed, InputError
from .memory import said_as_input_error
from .timeouts import check_timeout

CAPTURES = ("outputs", "all")


@dataclass(frozen=True)
class TensorSpec:
    """One model input as a backend sees it: its name, and its dtype and shape where the
    backend declares them (None: not declared; a None axis in ``shape`` may vary)."""

    name: str
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None


@dataclass(frozen=True)
class ModelIO:
    """What ``Runner.describe()`` returns, the same for every backend.

    Attributes:
        inputs: the model's inputs, in order.
        outputs: the names ``run`` returns, in order (empty for a torch module: its outputs
            are named by the call).
        blobs: every tensor the backend can extract by name (ncnn's blobs); empty where the
            backend does not list them.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...] = ()
    blobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class BlobCapture:
    """A ``capture`` that extracts the named tensors after feeding any tensors by name (an
    isolated run: reference values fed in the middle of the graph); see
    ``NcnnRunner.run_blobs``."""

    names: tuple[str, ...]


class Runner:
    """Runs one model on one backend. ``run`` returns {tensor name: numpy array}.

    A backend's runner implements ``feed`` (inputs checked against ``describe()``),
    ``_describe_local`` and ``_execute``; ``run`` calls them here or in the worker, with
    hooks for what a backend adds around a run (``_before_run``, ``_explain_crash``,
    ``_after_run``, ``_fit_outputs``): one public ``run``, as Polygraphy's runners keep one
    ``infer`` over ``infer_impl``."""

    name = "runner"
    isolated = False
    _remote: Any = None

    def describe(self) -> ModelIO:
        """Inputs (name, dtype, shape) and outputs of the model, as the backend sees them."""
        if self.isolated:
            return self._remote.describe()
        if getattr(self, "_described", None) is None:  # once: feed() asks on every run
            self._described = self._describe_local()
        return self._described

    def release(self) -> None:
        """Let the model go from the worker now (and the files its runs travel through); the
        next run loads it again. A runner that runs in this process keeps its model."""
        if self.isolated and self._remote is not None:
            self._remote.release()

    @property
    def worker_pid(self) -> int | None:
        """The process that runs this runner's model: the worker's pid once it has been
        used, None when the runner runs in this process (``isolated=False``)."""
        return self._remote.pid if self.isolated and self._remote is not None else None

    @property
    def timeout(self) -> float | None:
        """Seconds one call to the worker may take before it is abandoned (a fresh worker
        takes over); None in-process. Settable: ``runner.timeout = 1200``."""
        return self._remote.timeout if self.isolated and self._remote is not None else None

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        if self.isolated and self._remote is not None:
            self._remote.timeout = check_timeout(seconds)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.describe().inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.describe().outputs)

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs as {name: numpy array}, checked; subclasses check dtype and shape."""
        raise NotImplementedError

    def run(self, inputs: Any, capture: str = "outputs") -> dict[str, Any]:
        """Run the model once.

        Args:
            inputs: a dict by input name, a tuple in input order, or one array/tensor.
            capture: "outputs" for the model's outputs; "all" for those first, then every
                intermediate tensor the backend can capture.

        Returns:
            {tensor name: numpy array}, the outputs in ``output_names`` order.

        Raises:
            InputError: inputs of the wrong count, name, dtype or shape (with a hint).
            RunError / BackendCrashed / BackendTimeout: the backend failed, crashed or hung.
        """
        self._check_capture(capture)
        feed = self.feed(inputs)
        self._before_run(feed)
        try:
            with said_as_input_error(feed, self.model_label):
                result = (self._remote.execute(feed, capture) if self.isolated
                          else self._execute(feed, capture))
        except BackendCrashed as e:
            explained = self._explain_crash(feed, e)
            if explained is e:
                raise
            raise explained from e
        finally:
            self._after_run()
        return self._fit_outputs(result, capture)

    # -- hooks: what a backend adds to run(), each a no-op here ---------------------------
    def _before_run(self, feed: dict[str, Any]) -> None:
        """Called with the checked feed before the backend runs: refuse what must not run
        (raise), nothing by default."""

    def _explain_crash(self, feed: dict[str, Any], crashed: BackendCrashed) -> Exception:
        """The error to raise for a worker crash, given the feed that caused it: the crash
        itself by default; a backend may name the layer to blame."""
        return crashed

    def _after_run(self) -> None:
        """Called after every run, failed or not (a backend may retire a worker whose
        memory the run may have damaged)."""

    def _fit_outputs(self, result: dict[str, Any], capture: Any) -> dict[str, Any]:
        """The backend's results as ``run`` returns them (order, torch shapes); as they
        came by default."""
        return result

    @property
    def model_label(self) -> str:
        """The model as messages name it: its file's name (the backend's name without one)."""
        where = getattr(self, "path", None) or getattr(self, "param", None)
        return getattr(where, "name", None) or self.name

    def _describe_local(self) -> ModelIO:
        raise NotImplementedError

    def _execute(self, feed: dict[str, Any], capture: str) -> dict[str, Any]:
        raise NotImplementedError

    def _check_capture(self, capture: str) -> None:

        if capture not in CAPTURES:
            raise InputError(f"capture={capture!r} is not one of {CAPTURES}",
                             "use capture='outputs' (graph outputs) or 'all' (every tensor)")


def split_inputs(inputs: Any, names: list[str], model: str) -> list[Any]:
    """Inputs given as a dict by name, a tuple in order, or one array -> values in order."""

    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(names))
        missing = [n for n in names if n not in inputs]
        if unknown or missing:
            raise InputError(
                f"inputs for {model}: unknown {unknown or 'none'}, missing {missing or 'none'}; "
                f"the model's inputs are {names}",
                "pass a dict keyed by the model's input names, or a tuple in that order")
        return [inputs[n] for n in names]
    values = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if len(values) != len(names):
        raise InputError(f"{model} takes {len(names)} input(s) {names}, got {len(values)}",
                         "pass one array per model input, in order")
    return values


def to_numpy(v: Any) -> Any:
    """A numpy array of ``v`` (a torch tensor, an array, a list). A bfloat16 tensor, which
    numpy has no dtype for, becomes float32: exact, as bfloat16 is float32 cut short."""
    import numpy as np

    if hasattr(v, "detach"):
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":
            v = v.float()
        return v.numpy()
    return np.asarray(v)
