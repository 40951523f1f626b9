"""OrtRunner: an ONNX model in onnxruntime (CPU), IR version handled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import Runner

# onnxruntime's type strings -> numpy dtype names
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(int16)": "int16",
}


class OrtRunner(Runner):
    name = "onnxruntime"

    def __init__(self, source: Any) -> None:
        self.path = Path(getattr(source, "path", source))
        self._session = None
        self._all_session = None

    @property
    def session(self):
        if self._session is None:
            from ..onnx_io import session

            self._session = session(self.path)
        return self._session

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs (dict by name, or tuple in input order) checked and as numpy arrays."""
        import numpy as np

        specs = self.session.get_inputs()
        names = [s.name for s in specs]
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(names))
            missing = [n for n in names if n not in inputs]
            if unknown or missing:
                raise InputError(
                    f"inputs for {self.path.name}: unknown {unknown or 'none'}, missing "
                    f"{missing or 'none'}; the model's inputs are {names}",
                    "pass a dict keyed by the model's input names, or a tuple in that order")
            values = [inputs[n] for n in names]
        else:
            values = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
            if len(values) != len(specs):
                raise InputError(
                    f"{self.path.name} takes {len(specs)} input(s) {names}, got {len(values)}",
                    "pass one array per model input, in order")
        feed = {}
        for spec, v in zip(specs, values, strict=True):
            arr = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
            want = _ORT_TYPES.get(spec.type)
            if want and arr.dtype.name != want:
                raise InputError(
                    f"input {spec.name!r} of {self.path.name}: expected {want}, got "
                    f"{arr.dtype.name}", f"cast it, e.g. x.astype(np.{want})")
            shape = spec.shape
            bad_rank = len(shape) != arr.ndim
            bad_dim = not bad_rank and any(isinstance(d, int) and d != a
                                           for d, a in zip(shape, arr.shape, strict=True))
            if bad_rank or bad_dim:
                raise InputError(
                    f"input {spec.name!r} of {self.path.name}: expected shape "
                    f"{_fmt(shape)}, got {list(arr.shape)}",
                    "named or '?' axes may vary; the others are fixed by the export "
                    "(declare them in dynamic_axes to free them)")
            feed[spec.name] = arr
        return feed

    def run(self, inputs: Any, capture: str = "outputs") -> dict[str, Any]:
        self._check_capture(capture)
        feed = self.feed(inputs)
        sess = self.session if capture == "outputs" else self._session_all()
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feed), strict=True))

    def _session_all(self):
        """A second session whose outputs are every intermediate value (one pass)."""
        if self._all_session is None:
            from onnx import helper

            from ..onnx_io import load_onnx, session

            model = load_onnx(self.path)
            known = {o.name for o in model.graph.output}
            for node in model.graph.node:
                for out in node.output:
                    if out and out not in known:
                        model.graph.output.append(helper.make_empty_tensor_value_info(out))
                        known.add(out)
            self._all_session = session(model)
        return self._all_session


def _fmt(shape: list) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"
