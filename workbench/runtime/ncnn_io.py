"""What pnnx's conversion declares about an ncnn model's inputs and outputs: the ``_ncnn.py``
script it writes beside the param (how each blob is fed and read: rank, dtype, batch axis)
and the ``.pnnx.param`` shapes (dynamic axes included). NcnnRunner checks and feeds by these.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import shapes
from ..artifact.record import SIDECAR
from ..errors import WorkbenchError
from ..params import parse_pnnx_param
from .recorded import artifact_at

_TORCH_DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "int": "int32",
                 "long": "int64", "int64": "int64", "int32": "int32", "double": "float64",
                 "float64": "float64", "bool": "bool", "uint8": "uint8", "int8": "int8"}
INT_DTYPES = ("int32", "int64", "int8", "uint8", "bool")


@dataclass
class BlobSpec:
    """A model input or output as the conversion declared it.

    ``batch_axis`` is the torch axis ncnn takes as its batch (None: no batch axis, pnnx's
    ``batch_index=233``); ``shape`` the torch shape (None axes: left dynamic), from the
    ``.pnnx.param`` when it is found, else the example the ``_ncnn.py`` feeds."""

    name: str
    rank: int | None = None
    dtype: str = "float32"
    batch_axis: int | None = None
    example_shape: tuple[int, ...] | None = None
    shape: tuple[int | None, ...] | None = None


_INPUT = re.compile(r'ex\.input\("([^"]+)",\s*ncnn\.Mat\((\w+)(?:\.squeeze\((\d+)\))?\.numpy\(\)'
                    r'(?:,\s*batch_index=(\d+))?')
_EXTRACT = re.compile(r'_,\s*(\w+)\s*=\s*ex\.extract\("([^"]+)"\)')


def parse_ncnn_py(path: Path) -> tuple[dict[str, BlobSpec], dict[str, BlobSpec]]:
    """Inputs and outputs as pnnx's generated ``_ncnn.py`` feeds and reads them.

    pnnx writes ``inK = torch.rand(d0, d1, ..., dtype=...)`` (``torch.randint(10, (d0, ...),
    dtype=...)`` for integers), feeds ``ncnn.Mat(inK.numpy(), batch_index=N)`` and reads
    ``outK.numpy(batch_index=N)``; older pnnx fed ``inK.squeeze(0)`` and read
    ``np.array(outK)).unsqueeze(0)`` (batch axis 0) or wrote no batch at all.

    Args:
        path: the ``*_ncnn.py`` file.

    Returns:
        (inputs by ncnn blob name, outputs by blob name in the script's order: out0...outN).
    """
    text = path.read_text()
    by_var: dict[str, BlobSpec] = {}
    for m in re.finditer(r"^\s*(\w+) = torch\.(rand|randint)\((.*)\)\s*$", text, re.M):
        var, args = m.group(1), m.group(3)
        dt = re.search(r"dtype=torch\.(\w+)", args)
        if m.group(2) == "randint":  # randint(high, (d0, d1, ...), dtype=...)
            shape = re.search(r"\(([\d,\s]*)\)", args)
            dims = shape.group(1) if shape else ""
        else:  # rand(d0, d1, ..., dtype=...)
            dims = args.split("dtype")[0]
        nums = tuple(int(n) for n in re.findall(r"\d+", dims))
        by_var[var] = BlobSpec(var, len(nums), _TORCH_DTYPES.get(dt.group(1) if dt else "float",
                                                                 "float32"),
                               example_shape=nums, shape=nums)
    inputs: dict[str, BlobSpec] = {}
    for m in _INPUT.finditer(text):
        name, var, squeeze, index = m.groups()
        spec = by_var.get(var, BlobSpec(name))
        spec.name = name
        spec.batch_axis = (int(squeeze) if squeeze is not None
                           else shapes.batch_axis(int(index) if index else None))
        inputs[name] = spec
    outputs: dict[str, BlobSpec] = {}
    for m in _EXTRACT.finditer(text):
        var, name = m.groups()
        b = re.search(rf"\b{var}\.numpy\(batch_index=(\d+)\)", text)
        old = re.search(rf"np\.array\({var}\)\)\.unsqueeze\((\d+)\)", text)
        axis = (shapes.batch_axis(int(b.group(1))) if b
                else int(old.group(1)) if old else None)
        outputs[name] = BlobSpec(name, batch_axis=axis)
    return inputs, outputs


def pnnx_param_for(source: Any, param: Path) -> Path | None:
    """The ``.pnnx.param`` this ncnn model was converted from: the artifact's parent, one
    beside it (as pnnx writes them), or the parent named in the artifact folder's record."""
    parent = getattr(source, "parent", None)
    if getattr(parent, "format", None) == "pnnx" and Path(parent.path).exists():
        return Path(parent.path)
    beside = param.with_name(param.name[: -len(".ncnn.param")] + ".pnnx.param")
    if beside.exists():
        return beside
    try:  # a path inside a workspace: the sidecar names the parent artifact (its folder)

        rec = json.loads((param.parent / SIDECAR).read_text(encoding="utf-8"))
        up = json.loads((param.parent.parent / rec["parent"] / SIDECAR).read_text(
            encoding="utf-8"))
        found = param.parent.parent / rec["parent"] / up["main"]
        return found if up.get("format") == "pnnx" and found.exists() else None
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None


def declare_shapes(pnnx_param: Path | None, ins: dict[str, BlobSpec],
                    outs: dict[str, BlobSpec]) -> None:
    """Torch shapes (dynamic axes as None) from the pnnx graph: inputs in0..inN are its
    pnnx.Input operands in order, outputs out0..outN its outputs (tuples unpacked)."""
    if pnnx_param is None:
        return

    try:
        p = parse_pnnx_param(pnnx_param)
    except WorkbenchError:
        return
    for names, operands in ((ins, p.inputs), (outs, p.outputs)):
        if len(names) != len(operands):
            continue  # not the graph this model came from: keep what _ncnn.py says
        for spec, operand in zip(names.values(), operands, strict=True):
            note = p.operands[operand].shape
            if note is None or (spec.rank is not None and spec.rank != len(note)):
                continue  # no note (unknown, or a 0-d scalar): keep what _ncnn.py says
            spec.shape = tuple(d if isinstance(d, int) else None for d in note)
            spec.rank = len(note)


def recorded_input_shapes(source: Any, param: Path, names: list[str]
                          ) -> tuple[dict[str, tuple[int | None, ...]], str]:
    """The torch shape of each ncnn input (``names``, the Input layers' tops in order) as the
    conversion saw it, without the ``_ncnn.py``: the ``.pnnx.param``'s input operands (dynamic
    axes as None), else the ``inputshape`` the artifact's record holds (axes ``inputshape2``
    changes as None). Returns ({name: shape}, where they come from); ({}, "") when unknown."""
    pnnx = pnnx_param_for(source, param)
    if pnnx is not None:
        try:
            p = parse_pnnx_param(pnnx)
        except WorkbenchError:
            p = None
        notes = [p.operands[o].shape for o in p.inputs] if p is not None else []
        if notes and len(notes) == len(names) and all(n is not None for n in notes):
            return ({n: tuple(d if isinstance(d, int) else None for d in note)
                     for n, note in zip(names, notes, strict=True)}, f"the pnnx graph {pnnx.name}")
    params = getattr(source, "params", None)
    if params is None:
        art = artifact_at(param)
        params = art.params if art is not None else None
    if not isinstance(params, dict) or not isinstance(params.get("inputshape"), str):
        return {}, ""
    first = _shapes_of(params["inputshape"])
    second = _shapes_of(params.get("inputshape2") or "") or first
    if len(first) != len(names) or len(second) != len(first):
        return {}, ""
    return ({n: tuple(d if d == d2 else None for d, d2 in zip(a, b, strict=False))
             for n, a, b in zip(names, first, second, strict=True)
             if len(a) == len(b)}, "the inputshape its artifact.json records")


def _shapes_of(text: str) -> list[tuple[int, ...]]:
    """pnnx's ``inputshape=[1,3,224,224]f32,[1,16]i64`` -> [(1, 3, 224, 224), (1, 16)]."""
    return [tuple(int(d) for d in re.findall(r"\d+", dims))
            for dims in re.findall(r"\[([^\]]*)\]", text)]
