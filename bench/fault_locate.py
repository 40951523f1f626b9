"""Where a torch weight sits in a candidate (``bench/faults.py``), so a fault can be put there.

- ONNX: the initializer holding that weight (or a Constant node the simplifier wrote), found
  by value: as stored; transposed, as a Linear's MatMul holds it; scaled per output channel,
  as a BatchNorm or layer scale folded into it; or its values permuted, as LSTM gates are.
- ncnn: the ``.ncnn.bin`` is walked layer by layer from the ``.ncnn.param`` (each layer's
  weights in load order, a 4-byte flag tag before every blob ncnn loads with type 0); the walk
  must end exactly at the end of the file. The weight is found among those blobs the same way.

A module whose weight cannot be found (folded beyond recognition) is replaced by the nearest
one that can, and said so (``fault_trial.place_fault``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Store:
    """One array of the candidate that may hold a weight: an ONNX initializer or an ncnn blob."""

    label: str  # initializer name, or "layer name (type) blob k"
    values: Any  # float32, flat
    offset: int = -1  # ncnn: byte offset of the values in the .bin
    layer: str = ""  # ncnn: the layer that loads it


@dataclass
class Located:
    store: Store
    positions: Any  # for each flat index of the torch weight, its index in store.values (-1: none)
    relation: str  # "as stored", "transposed", "scaled per output channel", "permuted"
    # for each flat index of the torch weight, the factor folded into its stored value (a
    # BatchNorm's scale): what an added amount is multiplied by in the store; None: 1
    scale: Any = None


def locate(w: Any, stores: list[Store], name: str = "") -> Located | None:
    """Where the torch weight ``w`` (numpy) sits among ``stores``, and how; a store named
    ``name`` (the parameter's qualified name, as the exporter keeps it unless it folded the
    weight) is tried first."""
    import numpy as np

    stores = sorted(stores, key=lambda s: s.label != name)

    flat = w.reshape(-1).astype(np.float32)
    views = [("as stored", np.arange(flat.size))]
    if w.ndim == 2:  # a MatMul / Gemm holding W^T
        views.append(("transposed", np.arange(flat.size).reshape(w.shape[1], w.shape[0]).T
                      .reshape(-1)))
    same = [s for s in stores if s.values.size == flat.size]
    for s in same:
        for rel, perm in views:
            if np.array_equal(s.values[perm], flat):
                return Located(s, perm, rel)
    rows = w.shape[0]
    for s in same:  # a per-output-channel scale folded in (BatchNorm, layer scale)
        for rel, perm in views:
            got = s.values[perm].reshape(rows, -1).astype(np.float64)
            ref = flat.reshape(rows, -1).astype(np.float64)
            ok = np.abs(ref) > 1e-6 * (np.abs(ref).max() + 1e-30)
            if not ok.any():
                continue
            ratio = np.where(ok, got / np.where(ok, ref, 1.0), np.nan)
            scale = np.nanmedian(ratio, axis=1, keepdims=True)
            if np.all(np.isfinite(scale)) and np.all(scale != 0) and np.nanmax(
                    np.abs(ratio / scale - 1)) < 1e-4:
                what = "scaled" if np.allclose(scale, scale[0]) else "scaled per output channel"
                per_value = np.repeat(scale[:, 0], flat.size // rows).astype(np.float32)
                return Located(s, perm, f"{rel}, {what} (folded)", per_value)
    # the values themselves, anywhere in one store (LSTM gates reordered, q/k/v split...)
    keys = flat.view(np.uint32)
    for s in sorted(stores, key=lambda s: s.values.size):
        if s.values.size < flat.size:
            continue
        sv = s.values.view(np.uint32)
        order = np.argsort(sv, kind="stable")
        sorted_v = sv[order]
        lo = np.searchsorted(sorted_v, keys, "left")
        hi = np.searchsorted(sorted_v, keys, "right")
        unique = (hi - lo) == 1
        if unique.mean() < 0.9:
            continue
        pos = np.where(unique, order[np.minimum(lo, sv.size - 1)], -1)
        return Located(s, pos, "permuted (found by value)")
    return None


def onnx_stores(model: Any) -> list[Store]:
    import numpy as np
    from onnx import numpy_helper

    out = []
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size >= 16:
            out.append(Store(t.name, a.reshape(-1).copy()))
    for node in model.graph.node:  # constants the simplifier wrote as Constant nodes
        if node.op_type == "Constant":
            for at in node.attribute:
                if at.name == "value":
                    a = numpy_helper.to_array(at.t)
                    if a.dtype == np.float32 and a.size >= 16:
                        out.append(Store(f"Constant:{node.output[0]}", a.reshape(-1).copy()))
    return out


def ncnn_stores(param_path: Path) -> tuple[list[Store], str]:
    """Every weight blob of the .bin, by the engine's layer walk (workbench.ncnn_bin); (stores,
    note). The walk must account for every byte and find each blob stored as fp32;
    otherwise the whole file is one store (found by value only) and the note says why."""
    import numpy as np

    from workbench.ncnn_bin import walk_bin
    from workbench.params import parse_ncnn_param

    bin_path = param_path.with_name(param_path.name[: -len(".param")] + ".bin")
    layout = walk_bin(parse_ncnn_param(param_path), bin_path)
    problem = layout.problem or (f"layer type(s) {layout.unknown} not sized"
                                 if layout.unknown else "")
    if not problem and layout.end != layout.size:
        problem = f"the walk ends at byte {layout.end} of {layout.size}"
    # a MemoryData of raw bytes (a boolean mask, 21=3) holds no weight: not a store
    weights = [b for b in layout.blobs if b.storage != "int8-raw"]
    odd = next((b for b in weights if b.storage != "float32"), None)
    if not problem and odd is not None:
        problem = f"{odd.layer} ({odd.layer_type}) blob {odd.role}: stored as {odd.storage}"
    data = bin_path.read_bytes()
    if problem:
        whole = np.frombuffer(data[: len(data) // 4 * 4], np.float32).copy()
        return [Store("whole .ncnn.bin", whole, 0, "")], f"layer walk failed: {problem}"
    stores = [Store(f"{b.layer} ({b.layer_type}) {b.role}",
                    np.frombuffer(data, np.float32, b.count, b.offset).copy(), b.offset, b.layer)
              for b in weights]
    raw = len(layout.blobs) - len(weights)
    return stores, (f"layer walk: {len(stores)} blobs, {len(data)} bytes, every tag fp32"
                    + (f" ({raw} raw-byte MemoryData left out)" if raw else ""))

