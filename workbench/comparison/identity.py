"""Which PyTorch module a weight a converter stored is: identity from what does not change
when the weight's numbers are wrong.

A stored weight (an ncnn layer's blob, an ONNX initializer) is tied to a module's parameter
by this evidence, in this order:

1. *name*: the module the converter named its op for (pnnx writes ``nn.*`` ops under the
   module's qualified name; an initializer called ``conv2.weight``), when a parameter of that
   module fits it;
2. *structure*: the element count and the shape its layer declares (a convolution's output
   channels and kernel, an InnerProduct's outputs, a recurrent layer's gate rows, an
   initializer's exact shape). One module left: that one;
3. *neighbourhood*: of structurally equal candidates, those in the block of the modules named
   at the ops beside it (a fused conv+BN feeding ``features.1.conv.2`` is ``features.1.conv.*``);
4. *values*: of structurally equal candidates, the one whose sampled rows it matches (median
   |cosine| >= MATCH) alone -- what breaks a tie between equal shapes;
5. *one owner*: a parameter another stored weight holds is not this one's (unless this one's
   values say it is: a module called twice);
6. *position*: between stored weights already placed, the rest take the remaining candidates
   in order (the converter's graph order follows the module order), where the order leaves
   one choice. A weight whose layer declares no shape takes part only when another weight
   of its own layer is placed: the layer holds module weights, so this one is a parameter
   too (a fused attention's q, k, v and output projections, all of one size: a damaged q
   lies between the block's weights before it and its placed k). Its placed siblings bound
   it, not the modules named beside its op (at a block's input, the block before's).

Values never overrule a tie made by name or structure, except when they match another
parameter of the same size outright (then the shape rules misread that layer): a weight whose
numbers are destroyed stays tied to its module, so its fault is measured there. A weight whose
layer declares no shape (a Gemm's constant, which may be a buffer or pnnx's own) is tied only
by name or by values. Pure numpy, no converter format: ``weights.py`` builds the inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

MATCH = 0.9  # median |cosine| of the sampled rows for values to tie a weight to a parameter
ROWS = 64  # rows sampled per comparison (evenly spaced)
RECURRENT = frozenset({"LSTM", "GRU", "RNN"})


@dataclass(frozen=True)
class Stored:
    """A weight as a candidate stores it, and what its layer declares about it."""

    key: int  # graph order
    layer: str  # the ncnn layer or ONNX node that holds it
    kind: str  # its layer type / op type
    count: int
    load: Callable[[], Any]  # its values, flat float32 (read only when values are asked)
    rows: int | None = None  # output channels / features / gate rows the layer declares
    kernel: int | None = None  # kernel elements (a convolution)
    transposed: int = 0  # a transposed convolution's group count (its rows are axis 1)
    gates: int = 1  # a recurrent layer's gates (stored in another order than torch's)
    shape: tuple[int, ...] | None = None  # its exact shape (an ONNX initializer)
    name: str | None = None  # the module its op is named for
    near: tuple[str, ...] = ()  # modules named at the ops beside it

    @property
    def declared(self) -> bool:
        return self.rows is not None or self.shape is not None or self.name is not None


@dataclass(frozen=True)
class Param:
    """A parameter of the model (two or more axes): its module, name, module order, values."""

    module: str
    name: str
    rank: int
    value: Any  # numpy, in its own shape


@dataclass(frozen=True)
class Tie:
    """A stored weight's module, the evidence that decided it, and the parameter when one."""

    module: str
    evidence: str  # "name", "structure", "neighbourhood", "values", "one owner", "position"
    param: int | None = None


def identify(stored: list[Stored], params: list[Param]) -> dict[int, Tie]:
    """{index into ``stored``: its Tie} for every stored weight the evidence ties."""
    by_size: dict[int, list[int]] = {}
    for i, p in enumerate(params):
        by_size.setdefault(p.value.size, []).append(i)
    sims = _Sims(stored, params)
    same = [by_size.get(s.count, []) + (by_size.get(s.count // 2, []) if s.kind in RECURRENT
                                        and s.count % 2 == 0 else []) for s in stored]
    fits = [[i for i in found if _fits(s, params[i])] for s, found in zip(stored, same,
                                                                           strict=True)]
    narrowed = [_narrow(s, f, params) for s, f in zip(stored, fits, strict=True)]
    ties: dict[int, Tie] = {}
    changed = True
    while changed:
        changed = False
        for k in range(len(stored)):
            if k not in ties and (tie := _decide(k, stored[k], same[k], fits[k], narrowed[k],
                                                 ties, params, sims)) is not None:
                ties[k], changed = tie, True
        if not changed:
            changed = _by_position(stored, _in_placed_layers(stored, fits, narrowed, ties,
                                                             params), ties, params, sims)
    return ties


def _in_placed_layers(stored: list[Stored], fits: list[list[int]], narrowed: list[list[int]],
                      ties: dict[int, Tie], params: list[Param]) -> list[list[int]]:
    """``narrowed``, but a weight that declares no shape, in a layer whose other weights are
    tied, is narrowed by its name only: its placed siblings bound it in the module order,
    and the modules named beside its op (those it reads, at a block's input: the block
    before's) would narrow it to the wrong block."""
    return [_narrow(replace(s, near=()), fits[k], params)
            if not s.declared and k not in ties and _sibling_placed(stored, k, ties)
            else narrowed[k] for k, s in enumerate(stored)]


def _fits(s: Stored, p: Param) -> bool:
    """Does parameter ``p`` have the shape stored weight ``s``'s layer declares?"""
    shape = p.value.shape
    if s.shape is not None:  # an initializer: the same shape, or a MatMul's transposed one
        return shape in (s.shape, s.shape[::-1]) or [d for d in shape if d != 1] == [
            d for d in s.shape if d != 1]
    if s.rows is not None:
        if s.transposed:  # (in, out / groups, *kernel)
            rows = shape[1] * s.transposed if len(shape) > 1 else -1
        else:
            rows = shape[0]
        if s.kind in RECURRENT:
            rows = shape[0] // s.gates if shape[0] % s.gates == 0 else -1
        if rows != s.rows:
            return False
    if s.kernel is not None:
        kernel = 1
        for d in shape[2:]:
            kernel *= d
        return kernel == s.kernel
    return True


def _narrow(s: Stored, fits: list[int], params: list[Param]) -> list[int]:
    """``fits`` narrowed by the name its op carries, then by the modules named beside it
    (each only when it leaves a candidate)."""
    if s.name is not None:
        named = [i for i in fits if params[i].module == s.name
                 or params[i].module.startswith(s.name + ".")]
        if named:
            return named
    if s.near and len({params[i].module for i in fits}) > 1:
        shared = {i: max(_shared(params[i].module, m) for m in s.near) for i in fits}
        best = max(shared.values(), default=0)
        if best > 0:
            return [i for i in fits if shared[i] == best]
    return fits


def _shared(a: str, b: str) -> int:
    """How many leading parts two module paths share ('features.1.conv.3' and
    'features.1.conv.2': 3)."""
    n = 0
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        n += 1
    return n


def _decide(k: int, s: Stored, same: list[int], fits: list[int], narrowed: list[int],
            ties: dict[int, Tie], params: list[Param], sims: _Sims) -> Tie | None:
    strong = sims.strong(k, same)
    if strong is not None and (not s.declared or strong not in narrowed):
        # values alone (no shape declared), or values that match another parameter of the
        # size outright: the shape rules misread this layer
        return Tie(params[strong].module, "values", strong)
    if not narrowed or not s.declared:
        return None
    if len({params[i].module for i in narrowed}) == 1:
        return Tie(params[narrowed[0]].module, _evidence(s, fits, narrowed, params),
                   narrowed[0] if len(narrowed) == 1 else None)
    if strong is not None:  # in narrowed: values break the tie between equal shapes
        return Tie(params[strong].module, "values", strong)
    taken = {t.param for j, t in ties.items() if j != k and t.param is not None}
    live = [i for i in narrowed if i not in taken or sims.get(k, i) >= MATCH]
    modules = {params[i].module for i in live}
    if len(modules) == 1:
        return Tie(modules.pop(), "one owner", live[0] if len(live) == 1 else None)
    return None


def _evidence(s: Stored, fits: list[int], narrowed: list[int], params: list[Param]) -> str:
    if len({params[i].module for i in fits}) == 1:
        return "structure"
    named = s.name is not None and all(
        params[i].module == s.name or params[i].module.startswith(s.name + ".")
        for i in narrowed)
    return "name" if named else "neighbourhood"


def _by_position(stored: list[Stored], narrowed: list[list[int]], ties: dict[int, Tie],
                 params: list[Param], sims: _Sims) -> bool:
    """Tie what the order forces: each run of undecided stored weights between two placed
    ones takes the candidates whose module order lies between theirs, in order. True when
    it tied one."""
    rank = {p.module: p.rank for p in params}
    taken = {t.param for t in ties.values() if t.param is not None}
    changed = False
    for run, lo, hi in _runs(stored, narrowed, ties, rank):
        live = [[i for i in narrowed[k] if lo <= params[i].rank <= hi and (
            i not in taken or sims.get(k, i) >= MATCH)] for k in run]
        cols = sorted({i for found in live for i in found}, key=lambda i: (params[i].rank, i))
        for k, found in zip(run, _forced(live, cols), strict=True):
            modules = {params[i].module for i in found}
            if len(modules) == 1:
                ties[k] = Tie(modules.pop(), "position", found[0] if len(found) == 1 else None)
                changed = True
    return changed


def _runs(stored: list[Stored], narrowed: list[list[int]], ties: dict[int, Tie],
          rank: dict[str, int]) -> list[tuple[list[int], int, int]]:
    """(undecided stored weights in graph order, the module order before them, after them)
    for each run between two placed ones whose order is increasing."""
    out: list[tuple[list[int], int, int]] = []
    lo, run = -1, []
    for k in sorted(range(len(stored)), key=lambda k: stored[k].key):
        if k in ties:
            hi = rank[ties[k].module]
            if run and lo <= hi:
                out.append((run, lo, hi))
            lo, run = hi, []
        elif narrowed[k] and (stored[k].declared or _sibling_placed(stored, k, ties)):
            run.append(k)
    if run:
        out.append((run, lo, max(rank.values(), default=0)))
    return out


def _sibling_placed(stored: list[Stored], k: int, ties: dict[int, Tie]) -> bool:
    """Another weight of stored weight ``k``'s layer is tied to a module."""
    return any(j != k and stored[j].layer == stored[k].layer for j in ties)


def _forced(live: list[list[int]], cols: list[int]) -> list[list[int]]:
    """For each row, the columns it takes in every maximum order-keeping matching of rows
    to columns (an edge where ``live[row]`` holds the column): [] when it is unmatched in
    one of them."""
    n, m = len(live), len(cols)
    edge = [[c in found for c in cols] for found in map(set, live)]
    f = [[0] * (m + 1) for _ in range(n + 1)]  # best over rows[:a], cols[:b]
    g = [[0] * (m + 2) for _ in range(n + 2)]  # best over rows[a:], cols[b:]
    for a in range(1, n + 1):
        for b in range(1, m + 1):
            f[a][b] = max(f[a - 1][b], f[a][b - 1], f[a - 1][b - 1] + edge[a - 1][b - 1])
    for a in range(n - 1, -1, -1):
        for b in range(m - 1, -1, -1):
            g[a][b] = max(g[a + 1][b], g[a][b + 1], g[a + 1][b + 1] + edge[a][b])
    total = f[n][m]
    out = []
    for a in range(n):
        skipped = max(f[a][b] + g[a + 1][b] for b in range(m + 1))
        taken = [cols[b] for b in range(m) if edge[a][b]
                 and f[a][b] + 1 + g[a + 1][b + 1] == total]
        out.append(taken if total and skipped < total else [])
    return out


class _Sims:
    """Similarities of stored weights to parameters, computed when first asked."""

    def __init__(self, stored: list[Stored], params: list[Param]) -> None:
        self.stored, self.params = stored, params
        self.cache: dict[tuple[int, int], float] = {}
        # each weight's sampled rows in float64 and their norms, by (side, index, shape):
        # a 24-layer decoder compares each of 173 stored weights with ~57 parameters of its
        # size, and sampling, converting and normalising them again each time took 19 s
        self.rows: dict[tuple, tuple[Any, Any]] = {}

    def get(self, k: int, i: int) -> float:
        if (k, i) not in self.cache:
            s, w = self.stored[k], self.params[i].value
            data = s.load()
            if data is None or data.size not in (w.size, 2 * w.size):
                self.cache[k, i] = 0.0
            elif data.size == w.size:
                self.cache[k, i] = similarity(data, w, s.gates, (self.rows, ("s", k), ("p", i)))
            else:  # both directions of a bidirectional recurrent layer in one blob
                self.cache[k, i] = max(similarity(h, w, s.gates) for h in
                                       (data[: w.size], data[w.size:]))
        return self.cache[k, i]

    def strong(self, k: int, same: list[int]) -> int | None:
        """The parameter the values tie stored weight ``k`` to, alone; None when none matches
        clearly, or two of different modules match alike (a weight copied)."""
        scored = sorted(((self.get(k, i), i) for i in same), reverse=True)
        if not scored or scored[0][0] < MATCH:
            return None
        best, i = scored[0]
        if len(scored) > 1 and scored[1][0] >= MATCH and scored[1][0] > best - 1e-3 \
                and self.params[scored[1][1]].module != self.params[i].module:
            return None
        return i


def similarity(data: Any, w: Any, gates: int = 1, memo: tuple | None = None) -> float:
    """Median |cosine| between sampled rows of ``data`` laid out as ``w`` is (as stored,
    or transposed for a matrix, or with gate blocks in another order). ``memo``: (a dict,
    data's key, w's key) keeping each side's sampled rows for the next call."""
    import numpy as np

    rows = w.reshape(w.shape[0], -1)
    if rows.shape[1] < 4:  # rows too short for a cosine to mean anything: the whole weight
        rows = w.reshape(1, -1)
    best = _rows_cos(data.reshape(rows.shape), rows, memo, "rows")
    if w.ndim == 2 and best < MATCH:
        best = max(best, _rows_cos(data.reshape(w.shape[1], w.shape[0]), rows.T, memo,
                                   "transposed"))
    if gates > 1 and best < MATCH and rows.shape[0] % gates == 0:
        mine = np.split(data.reshape(rows.shape), gates)
        theirs = np.split(rows, gates)
        best = max(best, float(np.mean([max(_rows_cos(a, b) for b in theirs)
                                        for a in mine])))
    return best


def _rows_cos(a: Any, b: Any, memo: tuple | None = None, how: str = "rows") -> float:
    import numpy as np

    (a, na), (b, nb) = (_sampled(x, memo, side, how) for x, side in ((a, 1), (b, 2)))
    num = np.abs((a * b).sum(axis=1))
    den = na * nb
    cos = np.where(den > 0, num / np.maximum(den, 1e-30), 0.0)
    return float(np.median(cos)) if cos.size else 0.0


def _sampled(x: Any, memo: tuple | None, side: int, how: str) -> tuple[Any, Any]:
    """``x``'s sampled rows in float64 and their norms, kept in ``memo`` (a dict, then the
    two sides' keys) under its side's key, the layout and the shape."""
    import numpy as np

    key = None if memo is None else (memo[side], how, x.shape)
    if key is not None and key in memo[0]:
        return memo[0][key]
    rows = x[_rows(x.shape[0])].astype(np.float64)
    out = (rows, np.linalg.norm(rows, axis=1))
    if key is not None:
        memo[0][key] = out
    return out


@functools.lru_cache(maxsize=128)
def _rows(n: int) -> Any:
    import numpy as np

    return np.unique(np.linspace(0, n - 1, min(n, ROWS)).astype(np.int64))
