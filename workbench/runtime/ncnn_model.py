"""An ncnn model's files as ncnn will take them: which layers it cannot create, and whether
the .param and .bin fit each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..customops import is_custom_layer
from ..errors import ModelFileError
from ..ncnn_bin import walk_bin
from ..params import parse_ncnn_param


def unloadable_layers(param: Path) -> list[tuple[str, str]]:
    """(layer type, layer name) of every layer in an ncnn param that ncnn cannot create."""
    import ncnn


    bad = []
    lines = param.read_text().splitlines()[2:]
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and ncnn.layer_to_index(parts[0]) < 0 and not is_custom_layer(
                parts[0]):
            bad.append((parts[0], parts[1]))
    return bad


def check_model_files(param_path: Path, bin_path: Path) -> Any:
    """Refuse a .param/.bin pair ncnn would load and run wrongly: what the .param declares
    against what it holds (layer and blob counts, each blob written once: the parser's own
    checks), and the .bin's size against what the layers need, to the byte. Returns the
    parsed .param (an NcnnParam).

    ncnn checks neither: a .param whose layer count is too small runs a truncated graph, and
    a .bin of another model of the same or larger size loads and computes garbage."""

    param = parse_ncnn_param(param_path)  # counts, names, order: a hinted ModelFileError
    hint = ("a .param and its .bin come from one conversion: convert again with wb.to_ncnn "
            "and keep the two files together")
    if not bin_path.is_file():
        raise ModelFileError(f"ncnn weights {str(bin_path)!r} are not a file (a folder?)", hint)
    layout = walk_bin(param, bin_path)
    if layout.problem is not None:
        raise ModelFileError(f"{bin_path.name} does not fit {param_path.name}: "
                             f"{layout.problem}", hint)
    if layout.complete and layout.end != layout.size:
        how = "longer" if layout.size > layout.end else "shorter"
        raise ModelFileError(
            f"{bin_path.name} holds {layout.size} bytes, but the layers of {param_path.name} "
            f"read exactly {layout.end}: the file is {how} than the model needs (another "
            "model's weights, or a damaged file)", hint)
    return param


_COMBINE = frozenset({"BinaryOp", "Concat", "Eltwise", "MatMul", "Gemm"})
_FLATTEN = frozenset({"Reshape", "Flatten"})
_DENSE = frozenset({"InnerProduct", "Gemm"})


def size_baked_layers(param: Any) -> list[str]:
    """Layers of an ncnn graph that hold a size from the conversion's input shape, so that
    feeding another spatial or sequence size makes ncnn read past a buffer or broadcast
    wrongly (garbage, or a crash) instead of failing:

    - a constant (MemoryData: a position embedding, a folded weight) combined with
      activations by BinaryOp, Concat, Eltwise, MatMul or Gemm;
    - an InnerProduct or Gemm reading a flattened blob (its weights fix the flattened size);
    - a Reshape or Flatten with explicit positive sizes.

    A fully convolutional net holds none of these and takes any size, as ncnn does."""
    found: list[str] = []

    def through_splits(blob: str) -> list[Any]:
        out, todo = [], [blob]
        while todo:
            for name in param.consumers.get(todo.pop(), ()):
                layer = param.layer(name)
                if layer.type == "Split":
                    todo += layer.tops
                else:
                    out.append(layer)
        return out

    for layer in param.layers:
        if layer.type == "MemoryData":
            users = [u for t in layer.tops for u in through_splits(t) if u.type in _COMBINE]
            if users:
                found.append(f"{layer.name} (a constant {users[0].type} combines with the "
                             "activations)")
        elif layer.type in _FLATTEN:
            sizes = [v for k, v in layer.params.items() if k in (0, 1, 2, 11)]
            if any(isinstance(v, str) and v.lstrip("-").isdigit() and int(v) > 0
                   for v in sizes):
                found.append(f"{layer.name} (Reshape to fixed sizes)")
            dense = [u for t in layer.tops for u in through_splits(t) if u.type in _DENSE]
            if dense:
                found.append(f"{dense[0].name} ({dense[0].type} on a flattened blob)")
    return found
