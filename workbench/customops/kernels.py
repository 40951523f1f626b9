"""Kernels: an op's torch code run on numpy arrays, for ONNX Runtime and ncnn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


# -- kernels: the torch code on numpy arrays ---------------------------------------------------
def _run_torch_fn(fn: Callable, tensor_args: list[str], attr_args: list[tuple[str, str]],
                  arrays: list, attrs: dict[str, Any]) -> list:
    """Call the torch implementation on numpy arrays; numpy arrays back."""
    import numpy as np
    import torch

    kwargs = {n: torch.from_numpy(np.array(a)) for n, a in zip(tensor_args, arrays,
                                                              strict=False)}
    for n, kind in attr_args:
        if n in attrs:
            v = attrs[n]
            kwargs[n] = bool(v) if kind == "bool" else v
    with torch.no_grad():
        out = fn(**kwargs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.detach().cpu().numpy() for o in outs]


def _kernel(spec: dict[str, Any], which: str) -> Callable[..., list]:
    """The numpy kernel ``which`` ('ort' or 'ncnn') of a portable spec: list of arrays out."""
    custom = spec.get(which)
    if custom is not None and not isinstance(custom, type):
        def run(arrays: list, attrs: dict[str, Any]) -> list:
            out = custom(*arrays, **attrs)
            return list(out) if isinstance(out, (tuple, list)) else [out]
        return run
    return lambda arrays, attrs: _run_torch_fn(spec["fn"], spec["tensor_args"],
                                               spec["attr_args"], arrays, attrs)
