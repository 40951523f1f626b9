"""ncnn: registered ops as Python ``ncnn.Layer`` classes, registered on a Net before
``load_param``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .kernels import _kernel
from .ort import _PORTABLE, _known, _portable
from .registry import _OPS, RANK_IN, RANK_OUT

# -- ncnn --------------------------------------------------------------------------------------
_LAYERS: list[Any] = []  # live Python layers (ncnn holds only raw pointers to them)


def is_custom_layer(layer_type: str) -> bool:
    """Whether ``layer_type`` is the ncnn layer of a registered custom op."""
    return _known(layer_type)


def _layer_class(name: str) -> type:
    import ncnn
    import numpy as np

    spec = _portable(name)
    if isinstance(spec.get("ncnn"), type):
        return spec["ncnn"]
    n_in, n_out = len(spec["tensor_args"]), spec["n_outputs"]
    attr_args = sorted(spec["attr_args"])

    class PythonLayer(ncnn.Layer):
        def __init__(self) -> None:
            ncnn.Layer.__init__(self)
            self.one_blob_only = n_in == 1 and n_out == 1
            self.attrs: dict[str, Any] = {}
            self.ranks_in: list[int] = []
            self.ranks_out: list[int] = []
            _LAYERS.append(self)

        def load_param(self, pd: Any) -> int:
            for i, (a, kind) in enumerate(attr_args):
                if kind in ("int", "bool"):
                    self.attrs[a] = pd.get(i, 0)
                elif kind == "float":
                    self.attrs[a] = pd.get(i, 0.0)
                elif kind in ("ints", "floats"):
                    arr = np.array(pd.get(i, ncnn.Mat())).ravel()
                    self.attrs[a] = (arr.view(np.int32).tolist() if kind == "ints"
                                     else arr.astype(float).tolist())
            for pid, dest in ((RANK_IN, self.ranks_in), (RANK_OUT, self.ranks_out)):
                dest.extend(np.array(pd.get(pid, ncnn.Mat())).ravel().view(np.int32).tolist())
            return 0

        def _run(self, mats: list) -> list:
            arrays = [np.array(m) for m in mats]
            batched = False
            for i, a in enumerate(arrays):  # ncnn dropped the batch axis: put it back
                if i < len(self.ranks_in) and a.ndim < self.ranks_in[i]:
                    arrays[i] = a.reshape((1,) * (self.ranks_in[i] - a.ndim) + a.shape)
                    batched = True
            spec_now = _portable(name)
            outs = _kernel(spec_now, "ncnn")(arrays, self.attrs)
            result = []
            for i, o in enumerate(outs):
                o = np.asarray(o, dtype=np.float32)
                if batched and o.ndim > 1 and o.shape[0] == 1 and (
                        i >= len(self.ranks_out) or o.ndim == self.ranks_out[i]):
                    o = o.reshape(o.shape[1:])
                result.append(ncnn.Mat(np.ascontiguousarray(o)).clone())
            return result

        def forward(self, bottom: Any, top: Any, opt: Any) -> int:
            try:
                if self.one_blob_only:
                    out = self._run([bottom])
                    top.clone_from(out[0])
                else:
                    for t, o in zip(top, self._run(list(bottom)), strict=False):
                        t.clone_from(o)
            except Exception as e:  # ncnn only sees a status; the log keeps the reason
                import sys
                print(f"custom layer {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
                return -1
            return 0

    PythonLayer.__name__ = PythonLayer.__qualname__ = f"{name.replace('::', '_')}_layer"
    return PythonLayer


def _destroy(layer: Any) -> None:
    for i, live in enumerate(_LAYERS):
        if live is layer:
            del _LAYERS[i]
            break


def register_ncnn_layers(net: Any, param: Path) -> list[str]:
    """Register, on ``net``, the Python layer of each custom op the ncnn ``param`` uses."""
    if not (_OPS or _PORTABLE):
        return []
    used = sorted({ln.split()[0] for ln in Path(param).read_text().splitlines()[2:]
                   if ln.split() and _known(ln.split()[0])})
    for name in used:
        cls = _layer_class(name)
        net.register_custom_layer(name, cls, _destroy)
    return used
