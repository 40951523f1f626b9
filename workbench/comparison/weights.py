"""Which PyTorch modules an ncnn layer's weights came from (and an ONNX node's, where its
scope and its initializers' names say nothing).

ncnn blobs carry no module names, so alignment by values alone loses a layer exactly when
it matters: a damaged weight makes the layer's output unlike any torch tensor, and the
fault is then blamed on a later layer that happens to match again. A layer's *weights*
tie it to its module whatever its output's values: a Convolution holds its Conv2d's
weight (scaled per output channel when pnnx folded a BatchNorm into it), an InnerProduct or
Gemm its Linear's (maybe transposed), a MultiHeadAttention the q/k/v/out projections', an
LSTM its gates' (in ncnn's gate order). The tie is made on what a damaged weight keeps (the
name pnnx gave its op, the shape its layer declares, its place in the graph), the values
only breaking ties between equal shapes (``identity.py`` states the order of evidence);
this module reads the files into that evidence.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .identity import RECURRENT, Param, Stored, identify
from .pnnx_names import pnnx_names

# ncnn blob roles that hold a weight matrix (not a bias, a norm's gamma, a constant)
WEIGHT_ROLES = frozenset({"weight", "weight_xc", "weight_hc", "weight_hr", "A", "B",
                          "q_weight", "k_weight", "v_weight", "out_weight"})
DTYPES = {"float32": "<f4", "float16": "<f2", "int8": "i1"}  # how ncnn_bin says a blob is stored
GATES = {"LSTM": 4, "GRU": 3}  # recurrent layers store their gates in another order
# ONNX ops whose output is their module's whole computation (a MatMul's is not: its bias
# is added after it)
WHOLE_OPS = ("Conv", "ConvTranspose", "Gemm")


def model_params(model: Any) -> list[Param]:
    """Every parameter with two or more axes, as float32 numpy, with its module and the
    module's place in ``named_modules`` order; an nn.MultiheadAttention's packed
    ``in_proj_weight`` also as its q, k and v thirds."""
    import numpy as np

    out = []
    for rank, (mod_name, module) in enumerate(model.named_modules()):
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() < 2 or not p.dtype.is_floating_point:
                continue
            w = p.detach().float().cpu().numpy()
            out.append(Param(mod_name, pname, rank, w))
            if pname == "in_proj_weight" and w.shape[0] % 3 == 0:
                out.extend(Param(mod_name, f"{pname}[{k}/3]", rank, np.ascontiguousarray(c))
                           for k, c in enumerate(np.split(w, 3)))
    return out


def _fingerprint(model: Any) -> tuple:
    """Changes when a parameter is replaced or written in place (torch's version counter)."""
    return tuple((n, p.data_ptr(), p._version) for n, p in model.named_parameters())


def _stat(path: Path | None) -> tuple:
    if path is None or not path.is_file():
        return ()
    st = path.stat()
    return str(path.resolve()), st.st_mtime_ns, st.st_size


_CACHE: OrderedDict[tuple, dict[Any, tuple[str, ...]]] = OrderedDict()


def _cached(key: tuple, make: Any) -> Any:
    if key not in _CACHE:
        _CACHE[key] = make()
        while len(_CACHE) > 8:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key]


def ncnn_weight_modules(param_path: str | Path, model: Any,
                        pnnx_param: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """{ncnn layer name: the modules whose weights it holds, in the model's module order}.

    ``pnnx_param``: the ``.pnnx.param`` the model was converted from, whose op names tie
    layers by name (None: by shape, place and values only). Layers no evidence ties (a
    constant of pnnx's own, a model without named modules, a storage ncnn_bin cannot size)
    are left out. Cached on the files and the parameters."""
    from ..params import parse_ncnn_param

    param_path = Path(param_path)
    bin_path = param_path.with_suffix(".bin")
    if not bin_path.is_file() or not hasattr(model, "named_modules"):
        return {}
    pnnx = Path(pnnx_param) if pnnx_param is not None else None
    key = ("ncnn", _stat(param_path), _stat(bin_path), _stat(pnnx), id(model),
           _fingerprint(model))
    return _cached(key, lambda: _link_ncnn(parse_ncnn_param(param_path), bin_path, pnnx,
                                           model_params(model),
                                           {n for n, _ in model.named_modules()}))


def _link_ncnn(param: Any, bin_path: Path, pnnx: Path | None, params: list[Param],
               modules: set[str]) -> dict[str, tuple[str, ...]]:
    from ..ncnn_bin import walk_bin

    layers = {layer.name: layer for layer in param.layers}
    blobs = [b for b in walk_bin(param, bin_path).blobs
             if b.role in WEIGHT_ROLES and b.storage in DTYPES]
    firsts: dict[str, int] = {}
    for b in blobs:
        firsts.setdefault(b.layer, b.count)
    names = pnnx_names(pnnx, list(firsts.items()), modules)
    stored = [Stored(k, b.layer, b.layer_type, b.count, _ncnn_loader(bin_path, b),
                     name=names.get(b.layer, (None, ()))[0],
                     near=names.get(b.layer, (None, ()))[1],
                     **_declared(layers[b.layer], b.role))
              for k, b in enumerate(blobs)]
    return _by_layer(stored, identify(stored, params), params)


def _by_layer(stored: list[Stored], ties: dict[int, Any], params: list[Param]
              ) -> dict[Any, tuple[str, ...]]:
    rank = {p.module: p.rank for p in params}
    out: dict[Any, set[str]] = {}
    for k, tie in ties.items():
        out.setdefault(stored[k].layer, set()).add(tie.module)
    return {layer: tuple(sorted(mods, key=lambda m: rank.get(m, len(rank))))
            for layer, mods in out.items()}


def _ncnn_loader(bin_path: Path, blob: Any) -> Any:
    @functools.cache
    def load() -> Any:
        import numpy as np

        # int8 weights as they are: a row's cosine does not see its scale. fp32 ones map
        # the file (no copy of a 545 MB embedding; its pages read as they are compared)
        dtype = np.dtype(DTYPES[blob.storage])
        if blob.offset + blob.count * dtype.itemsize > bin_path.stat().st_size:
            return None
        data = np.memmap(bin_path, dtype, mode="r", offset=blob.offset, shape=(blob.count,))
        return data.astype(np.float32, copy=False)
    return load


def _int(layer: Any, key: int, default: int = 0) -> int:
    v = layer.params.get(key)
    if v is None:
        return default
    try:
        return int(float(v if isinstance(v, str) else v[0]))
    except (ValueError, IndexError):
        return default


def _declared(layer: Any, role: str) -> dict[str, Any]:
    """What ``layer`` declares about its weight blob ``role``: the rows (output channels,
    features, a recurrent layer's hidden size), the kernel's elements, the gates; {} when
    nothing (a Gemm's constant, an attention's projections: tied by name or values)."""
    t = layer.type

    def p(key: int, default: int = 0) -> int:
        return _int(layer, key, default)

    if t.startswith(("Convolution", "Deconvolution", "DeformableConv2D")) and role == "weight":
        kw = p(1)
        kernel = kw if t.endswith("1D") else kw * p(11, kw) * (p(21, kw) if t.endswith("3D")
                                                                else 1)
        transposed = (p(7, 1) if "DepthWise" in t else 1) if t.startswith("Deconv") else 0
        return {"rows": p(0), "kernel": kernel, "transposed": transposed}
    if t == "InnerProduct" and role == "weight":
        return {"rows": p(0)}
    if t == "Embed" and role == "weight":
        return {"rows": p(1)}  # (num_embeddings, embedding_dim)
    if t in RECURRENT and role in ("weight_xc", "weight_hc"):
        return {"rows": p(3, p(0)) if t == "LSTM" else p(0), "gates": GATES.get(t, 1)}
    if t in RECURRENT:
        return {"gates": GATES.get(t, 1)}
    return {}


def onnx_weight_modules(path: str | Path, model: Any, named: dict[int, str | None]
                        ) -> dict[int, tuple[str, ...]]:
    """{ONNX node index: the modules whose weights it holds} for the Conv, ConvTranspose and
    Gemm nodes that read an initializer of two or more axes, tied by ``identity`` with the
    initializers' exact shapes; ``named``: the module each node is already known for (its
    scope, its initializer's name), which places the others. Cached on the file and the
    parameters."""
    path = Path(path)
    if not hasattr(model, "named_modules"):
        return {}
    key = ("onnx", _stat(path), tuple(sorted(named.items(), key=lambda kv: kv[0])),
           id(model), _fingerprint(model))
    return _cached(key, lambda: _link_onnx(path, named, model_params(model)))


def _link_onnx(path: Path, named: dict[int, str | None], params: list[Param]
               ) -> dict[int, tuple[str, ...]]:
    from ..runtime.onnx_wire import structure

    graph = structure(path).graph  # the weights read where they lie, when asked for
    inits = {t.name: t for t in graph.initializer if len(t.dims) >= 2}
    stored = []
    for k, node in enumerate(graph.node):
        if node.op_type not in (*WHOLE_OPS, "MatMul"):
            continue  # a MatMul places the others, but is not its Linear's output
        for name in node.input:
            if name in inits:
                t = inits[name]
                shape = tuple(int(d) for d in t.dims)
                count = 1
                for d in shape:
                    count *= d
                stored.append(Stored(k, str(k), node.op_type, count, _onnx_loader(path, t),
                                     shape=shape, name=named.get(k)))
                break
    ties = identify(stored, params)
    whole = {s.key for s in stored if s.kind in WHOLE_OPS}
    return {int(k): mods for k, mods in _by_layer(stored, ties, params).items()
            if int(k) in whole}


def _onnx_loader(path: Path, tensor: Any) -> Any:
    @functools.cache
    def load() -> Any:
        import numpy as np

        from ..runtime.onnx_wire import initializer

        try:
            values = initializer(path, tensor)
        except (ValueError, TypeError, OSError):  # not readable as an array
            return None
        return None if values is None else values.astype(np.float32).ravel()
    return load
