"""Which PyTorch modules an ncnn layer's weights came from.

ncnn blobs carry no module names, so alignment by values alone loses a layer exactly when
it matters: a damaged weight makes the layer's output unlike any torch tensor, and the
fault is then blamed on a later layer that happens to match again. A layer's *weights*
tie it to its module whatever its output's values: a Convolution holds its Conv2d's
weight (scaled per output channel when pnnx folded a BatchNorm into it), an InnerProduct or
Gemm its Linear's (maybe transposed), a MultiHeadAttention the q/k/v/out projections', an
LSTM its gates' (in ncnn's gate order). A perturbed weight still points at its module:
the match is by the cosine of sampled rows, which 10% noise on a quarter of the values
barely moves, while two different random weights of one size are far apart.

No library maps converter layers back to source weights (pnnx's own .pnnx.param names
some operators by module, but not those it folded, e.g. ``convbn2d_0``), hence this module.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from pathlib import Path
from typing import Any

MATCH = 0.9  # median |cosine| of the sampled rows for a weight to be a module's
ROWS = 64  # rows sampled per comparison (evenly spaced)
# ncnn blob roles that hold a weight matrix (not a bias, a norm's gamma, a constant)
WEIGHT_ROLES = frozenset({"weight", "weight_xc", "weight_hc", "weight_hr", "A", "B",
                          "q_weight", "k_weight", "v_weight", "out_weight"})
DTYPES = {"float32": "<f4", "float16": "<f2", "int8": "i1"}  # how ncnn_bin says a blob is stored
GATES = {"LSTM": 4, "GRU": 3}  # recurrent layers store their gates in another order


def torch_weights(model: Any) -> list[tuple[str, Any]]:
    """(module name, weight as float32 numpy) of every parameter with two or more axes;
    an nn.MultiheadAttention's packed ``in_proj_weight`` also as its q, k and v thirds."""
    import numpy as np

    out = []
    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() < 2 or not p.dtype.is_floating_point:
                continue
            w = p.detach().float().cpu().numpy()
            out.append((mod_name, w))
            if pname == "in_proj_weight" and w.shape[0] % 3 == 0:
                out.extend((mod_name, np.ascontiguousarray(c)) for c in np.split(w, 3))
    return out


def _fingerprint(model: Any) -> tuple:
    """Changes when a parameter is replaced or written in place (torch's version counter)."""
    return tuple((n, p.data_ptr(), p._version) for n, p in model.named_parameters())


_CACHE: OrderedDict[tuple, dict[str, tuple[str, ...]]] = OrderedDict()


def ncnn_weight_modules(param_path: str | Path, model: Any) -> dict[str, tuple[str, ...]]:
    """{ncnn layer name: the modules whose weights it holds, in the model's module order}.

    Layers whose weights match no module (a constant of pnnx's own, a model without named
    modules, a storage ncnn_bin cannot size) are left out. Cached on the files and the parameters."""
    from ..params import parse_ncnn_param

    param_path = Path(param_path)
    bin_path = param_path.with_suffix(".bin")
    if not bin_path.is_file() or not hasattr(model, "named_modules"):
        return {}
    st, sb = param_path.stat(), bin_path.stat()
    key = (str(param_path.resolve()), st.st_mtime_ns, st.st_size, sb.st_mtime_ns,
           sb.st_size, id(model), _fingerprint(model))
    if key not in _CACHE:
        _CACHE[key] = _link(parse_ncnn_param(param_path), bin_path, torch_weights(model),
                            [n for n, _ in model.named_modules()])
        while len(_CACHE) > 8:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return _CACHE[key]


def _link(param: Any, bin_path: Path, weights: list[tuple[str, Any]],
          order: list[str]) -> dict[str, tuple[str, ...]]:
    import numpy as np

    from ..ncnn_bin import walk_bin

    by_size: dict[int, list[tuple[str, Any]]] = {}
    for name, w in weights:
        by_size.setdefault(w.size, []).append((name, w))
    rank = {n: i for i, n in enumerate(order)}
    layout = walk_bin(param, bin_path)
    out: dict[str, list[str]] = {}
    with open(bin_path, "rb") as f:
        for blob in layout.blobs:
            if blob.role not in WEIGHT_ROLES or blob.storage not in DTYPES:
                continue
            f.seek(blob.offset)
            # int8 weights as they are: a row's cosine does not see its scale
            data = np.fromfile(f, DTYPES[blob.storage], blob.count).astype(np.float32)
            if data.size != blob.count:
                continue
            found = _best(data, by_size, GATES.get(blob.layer_type, 1))
            if found is None and blob.layer_type in ("LSTM", "GRU", "RNN") and data.size % 2 == 0:
                # bidirectional: ncnn stores both directions in one blob
                halves = [_best(h, by_size, GATES.get(blob.layer_type, 1))
                          for h in np.split(data, 2)]
                found = [m for m in halves if m is not None] or None
                if found:
                    for m in found:
                        out.setdefault(blob.layer, []).append(m)
                continue
            if found is not None:
                out.setdefault(blob.layer, []).append(found)
    return {layer: tuple(sorted(set(mods), key=lambda m: rank.get(m, len(rank))))
            for layer, mods in out.items()}


def _best(data: Any, by_size: dict[int, list[tuple[str, Any]]], gates: int) -> str | None:
    """The module whose weight ``data`` is, or None when none matches clearly."""
    scored = sorted(((_similarity(data, w, gates), name) for name, w in
                     by_size.get(data.size, ())), reverse=True)
    if not scored or scored[0][0] < MATCH:
        return None
    best, name = scored[0]
    # two modules equally like it (a weight shared or copied): the first is as good a guess
    # as any, but only when they are one module's (in_proj thirds); else say nothing
    if len(scored) > 1 and scored[1][0] >= MATCH and scored[1][1] != name \
            and scored[1][0] > best - 1e-3:
        return None
    return name


def _similarity(data: Any, w: Any, gates: int) -> float:
    """Median |cosine| between sampled rows of ``data`` laid out as ``w`` is (as stored,
    or transposed for a matrix, or with gate blocks in another order)."""
    import numpy as np

    rows = w.reshape(w.shape[0], -1)
    if rows.shape[1] < 4:  # rows too short for a cosine to mean anything: the whole weight
        rows = w.reshape(1, -1)
    best = _rows_cos(data.reshape(rows.shape), rows)
    if w.ndim == 2 and best < MATCH:
        best = max(best, _rows_cos(data.reshape(w.shape[1], w.shape[0]), rows.T))
    if gates > 1 and best < MATCH and rows.shape[0] % gates == 0:
        mine = np.split(data.reshape(rows.shape), gates)
        theirs = np.split(rows, gates)
        best = max(best, float(np.mean([max(_rows_cos(a, b) for b in theirs)
                                        for a in mine])))
    return best


def _rows_cos(a: Any, b: Any) -> float:
    import numpy as np

    idx = _rows(a.shape[0])
    a, b = a[idx].astype(np.float64), b[idx].astype(np.float64)
    num = np.abs((a * b).sum(axis=1))
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(den > 0, num / np.maximum(den, 1e-30), 0.0)
    return float(np.median(cos)) if cos.size else 0.0


@functools.lru_cache(maxsize=128)
def _rows(n: int) -> Any:
    import numpy as np

    return np.unique(np.linspace(0, n - 1, min(n, ROWS)).astype(np.int64))
