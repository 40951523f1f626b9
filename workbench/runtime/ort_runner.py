"""OrtRunner: an ONNX model in onnxruntime (CPU), IR version handled, crash-isolated by default."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import customops as cops
from ..errors import InputError, WorkbenchError
from ..graph import summarize
from ..onnx_io import check_model_file, check_readable, detect_format
from .base import ModelIO, Runner, TensorSpec, split_inputs, to_numpy
from .heap import keep_freed_memory
from .memory import allocation_failure, check_fits, too_large
from .onnx_wire import structure
from .ort_all import all_outputs_session
from .ort_session import explain_ort_run_error, session
from .recorded import check_recorded
from .remote import RemoteHandle

# onnxruntime's type strings -> numpy dtype names
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(int16)": "int16",
}


WARM = ("onnxruntime", __name__)  # what a worker imports to run one (worker.warm)


class OrtRunner(Runner):
    name = "onnxruntime"

    def __init__(self, source: Any, isolated: bool = True, libraries: Any = (),
                 num_threads: int = 0, timeout: float | None = None,
                 session_factory: Callable[[], Any] | None = None) -> None:
        """An ONNX model in onnxruntime's CPU provider.

        Args:
            source: an Artifact or a path to a .onnx file.
            isolated: run in the crash-isolating worker process (a segfault becomes
                BackendCrashed); False runs in this process.
            libraries: custom-op libraries (.so) to register with the session.
            num_threads: intra-op threads; 0 lets ONNX Runtime choose.
            timeout: seconds one run may take in the worker before it is abandoned and the
                worker replaced (BackendTimeout); default scales with the model's size.
            session_factory: a callable returning the ``onnxruntime.InferenceSession`` to run
                ``source`` with (your providers and options), called once on first use;
                None builds one (``ort_session.session``). A factory runs in this process
                (``isolated`` is then False): a session cannot be sent to the worker.
                capture="all" still builds its own session, with every tensor an output.
        """

        self.path = Path(getattr(source, "path", source))
        _check_file(self.path)  # a clear error here, not a native one in the worker

        check_recorded(source, self.path)  # as its stage wrote it: an Artifact, or a path in one
        self.isolated = isolated
        self.num_threads = num_threads  # intra-op threads; 0: ONNX Runtime's default
        self.libraries = [str(x) for x in ([libraries] if isinstance(libraries, (str, Path))
                                           else libraries)]
        self._session = None
        self._all_session = None
        # capture and input shapes -> the results' (name, shape, dtype), learned on a first
        # run in the worker so later runs bind them (None: they cannot be bound)
        self._layouts: dict[tuple, list[tuple] | None] = {}
        if session_factory is not None and not callable(session_factory):
            raise InputError(f"session_factory must be callable, got "
                             f"{type(session_factory).__name__}",
                             "pass a function, e.g. lambda: ort.InferenceSession(path, so)")
        self._session_factory = session_factory
        isolated = isolated and session_factory is None
        # the worker lacks this process's Python custom ops: they travel pickled by value
        # (None: they cannot, so run here; see workbench/customops/shipping.py)
        ship = cops.for_worker(self.path) if isolated else b""
        self.isolated = isolated = isolated and ship is not None
        if isolated:
            self._remote = RemoteHandle("workbench.runtime.ort_runner:OrtRunner",
                                        (str(self.path),), {"libraries": self.libraries,
                                                            "num_threads": num_threads},
                                        self.name, timeout=timeout, custom_ops=ship)

    @property
    def session(self):
        if self._session is None and self._session_factory is not None:
            self._session = self._session_factory()
        if self._session is None:
            self._session = session(self.path, self.libraries, **self._options())
        return self._session

    def _options(self) -> dict[str, Any]:
        return {"intra_op_num_threads": self.num_threads} if self.num_threads else {}

    def _describe_local(self) -> ModelIO:
        # from the graph, not a session: a session made only to describe the model would
        # cost as much as the one that runs it (and capture="all" builds its own)

        try:  # the graph without its weights' bytes (onnx_wire): no parse of gigabytes
            g = summarize(structure(self.path))
        except (ValueError, OSError):
            g = summarize(self.path)  # says what is wrong with the file
        return ModelIO(inputs=tuple(
            TensorSpec(t.name, t.dtype, None if t.shape is None else
                       tuple(d if isinstance(d, int) else None for d in t.shape))
            for t in g.inputs), outputs=tuple(t.name for t in g.outputs))

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs (dict by name, or tuple in input order) checked and as numpy arrays."""
        specs = self.describe().inputs
        values = split_inputs(inputs, [s.name for s in specs], self.path.name)
        feed = {}
        for spec, v in zip(specs, values, strict=True):
            if getattr(v, "is_meta", False):  # shape only: torch cannot copy it out
                raise InputError(f"input {spec.name!r} of {self.path.name}: a meta tensor "
                                 "holds no values", "pass a tensor with data (on the CPU), e.g. "
                                 "torch.randn(shape)")
            arr = to_numpy(v)
            name, want, shape = spec.name, spec.dtype, spec.shape
            if want in _ORT_TYPES.values() and arr.dtype.name != want:
                raise InputError(f"input {name!r} of {self.path.name}: expected {want}, got "
                                 f"{arr.dtype.name}", f"cast it, e.g. x.astype(np.{want})")
            bad = shape is not None and (len(shape) != arr.ndim or any(
                isinstance(d, int) and d != a for d, a in zip(shape, arr.shape, strict=True)))
            if bad:
                dims = ", ".join("?" if d is None else str(d) for d in shape)
                raise InputError(
                    f"input {name!r} of {self.path.name}: expected shape [{dims}], got "
                    f"{list(arr.shape)}",
                    "named or '?' axes may vary; the others are fixed by the export "
                    "(declare them in dynamic_axes to free them)")
            feed[name] = arr

        # copied to the worker, or by ONNX Runtime to contiguous memory
        copied = {n: a for n, a in feed.items() if self.isolated or not a.flags.c_contiguous}
        check_fits(copied, self.path.name, what="the run copies it")
        return feed

    def _execute(self, feed: dict[str, Any], capture: str,
                 arena: Any = None) -> dict[str, Any]:
        """Run the session; in the worker (``arena`` given) ONNX Runtime writes the results
        straight into the reply file, once a first run has shown their shapes."""
        if capture != "outputs":
            keep_freed_memory()  # ~one fresh array per node each run: reuse their memory
        sess = self.session if capture == "outputs" else self._session_all()
        names = [o.name for o in sess.get_outputs()]
        key = (capture, tuple((n, a.shape, a.dtype.str) for n, a in feed.items()))
        layouts = self._layouts
        if arena is not None and layouts.get(key):
            out = self._run_bound(sess, feed, layouts[key], arena)
            if out is not None:
                return out
            layouts[key] = None  # shapes that depend on the values: run it unbound from now
        try:
            out = dict(zip(names, sess.run(names, feed), strict=True))
        except Exception as e:  # a node failed on these inputs: name it, say why

            if isinstance(e, WorkbenchError):
                raise

            if (tried := allocation_failure(e)) is not None:
                raise too_large(feed, self.path.name, tried, str(e)) from None
            raise explain_ort_run_error(str(e), self.path) from None
        if arena is not None and key not in layouts:
            layouts[key] = [(n, out[n].shape, out[n].dtype) for n in names]
        return out

    @staticmethod
    def _run_bound(sess: Any, feed: dict[str, Any], layout: list[tuple],
                   arena: Any) -> dict[str, Any] | None:
        """Run with every output bound to an array of ``arena`` (an IO binding): no copy
        out of ONNX Runtime's buffers, and no allocation of them. None when ONNX Runtime
        refuses the shapes (an output whose shape depends on the input values)."""
        if any(dtype.hasobject or 0 in shape for _, shape, dtype in layout):
            return None  # strings, empty tensors: the plain run handles them
        binding = sess.io_binding()
        for name, arr in feed.items():
            binding.bind_cpu_input(name, arr)
        out = {}
        for name, shape, dtype in layout:
            arr = out[name] = arena.alloc(shape, dtype)
            binding.bind_output(name, "cpu", 0, dtype, list(shape), arr.ctypes.data)
        try:
            sess.run_with_iobinding(binding)
        except Exception:  # noqa: BLE001 - a shape mismatch; any real error recurs unbound
            return None
        finally:
            binding.clear_binding_outputs()  # the arena's mappings go after this run
        return out

    def _session_all(self):
        """A second session whose outputs are every intermediate value (one pass), its
        weights read by ONNX Runtime from their files (ort_all.py)."""
        if self._all_session is None:
            self._all_session = all_outputs_session(self.path, self.libraries,
                                                    **self._options())
        return self._all_session


def _check_file(path: Path) -> None:
    """ModelFileError unless ``path`` is an ONNX model a runner can load: checked on its
    graph without the weights' bytes (onnx_wire.structure), and by a full parse only where
    that finds something wrong (it names what). The worker's twin of a runner skips it:
    the runner checked the file in this process."""
    from . import worker_main

    if worker_main.SERVING:
        return
    if detect_format(path) != "onnx":
        check_model_file(path)
        return
    try:
        model = structure(path)
    except (ValueError, OSError):
        check_model_file(path)  # raises, naming what is wrong
        return
    if not model.HasField("graph") or not model.opset_import:
        check_model_file(path)
    check_readable(model, path)
