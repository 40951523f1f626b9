"""Linear rule: ``x @ W + b`` back to one op (``Gemm`` on rank 2, a ``Linear`` function above).

Forms seen in real exports (torch 2.13, both exporters, before and after onnxslim):
- ``Add(MatMul(x, W), b)``: ``x @ w + b`` written by hand, or ``nn.Linear`` on a rank-3
  input (TorchScript and dynamo exporters).
- ``Reshape(Gemm(Reshape(x, [-1, K]), W, b), [..., N])``: onnxslim turns a rank-3
  MatMul + Add into a rank-2 Gemm between two Reshapes, which adds a node.

The standard form is ``Gemm`` (rank-2 input, bias broadcastable to the (M, N) output, the
unidirectional broadcast Gemm allows); ONNX has no op for a Linear over a batch of rows,
so a rank-3 or higher input is raised to the function form ``pkg.workbench::Linear`` (the
body is the matched subgraph, so ONNX Runtime computes exactly what it did before).
"""

from __future__ import annotations

from . import Rule, attr, const, dims, fail, rank, register

_FLOAT = ("FLOAT", "FLOAT16", "DOUBLE", "BFLOAT16")


def matmul_add(op, x, w, b):
    return op.Add(op.MatMul(x, w), b)


def reshaped_gemm(op, x, s_in, w, b, s_out):
    g = op.Gemm(op.Reshape(x, s_in), w, b, _allow_other_attributes=True, _outputs=["gemm"])
    return op.Reshape(g, s_out)


def _dtype(value) -> str | None:
    t = getattr(value, "type", None)
    dt = getattr(t, "dtype", None)
    return getattr(dt, "name", None)


def _bias_broadcasts(b, m: int | None, n: int | None) -> bool:
    """``b`` broadcasts unidirectionally to the (M, N) output: rank <= 2, each dim 1 or equal."""
    bd = dims(b)
    if bd is None:
        arr = const(b)
        bd = list(arr.shape) if arr is not None else None
    if bd is None or len(bd) > 2:
        return False
    bd = [1] * (2 - len(bd)) + bd
    return all(d == 1 or (want is not None and d == want) for d, want in zip(bd, (m, n),
                                                                              strict=True))


def _check_matmul_add(ctx, x, w, b, **_):
    rx, rw = rank(x), rank(w)
    if rx is None or rw != 2:
        return fail(f"Linear: ranks of x and W are {rx} and {rw}; W must be rank 2 and x known")
    if rx < 2:
        return fail("Linear: x is a vector (MatMul would drop an axis)")
    if const(w) is None:
        return fail("Linear: W is not a constant (a product of two activations, not a layer)")
    if _dtype(x) not in _FLOAT:
        return fail(f"Linear: dtype {_dtype(x)} is not a float type Gemm takes")
    xd, wd = dims(x), dims(w)
    n = wd[1]
    if rx == 2:
        if not _bias_broadcasts(b, xd[0], n):
            return fail(f"Linear: bias of shape {dims(b)} does not broadcast to the "
                        f"({xd[0]}, {n}) output the way Gemm allows")
    else:  # a batch of rows: the bias must be a constant per output feature
        arr = const(b)
        if arr is None or arr.size not in (1, n) or (arr.ndim and arr.shape[-1] not in (1, n)) \
                or any(s != 1 for s in arr.shape[:-1]):
            return fail(f"Linear: bias {None if arr is None else arr.shape} is not one value "
                        f"per output feature ({n})")
    return True


def _check_reshaped_gemm(ctx, x, s_in, w, b, s_out, gemm):
    node = gemm.producer()
    if attr(node, "transA", 0) != 0 or attr(node, "alpha", 1.0) != 1.0 \
            or attr(node, "beta", 1.0) != 1.0:
        return fail("Linear: the Gemm transposes A or scales (alpha/beta != 1)")
    si, so, xd = const(s_in), const(s_out), dims(x)
    if si is None or so is None or xd is None or len(xd) < 3:
        return fail("Linear: reshape shapes or the input's rank unknown")
    si, so = [int(v) for v in si.reshape(-1)], [int(v) for v in so.reshape(-1)]
    k = xd[-1]
    rows = None if any(d is None for d in xd[:-1]) else _prod(xd[:-1])
    if len(si) != 2 or si[1] != k or si[0] not in (-1, rows):
        return fail(f"Linear: first Reshape to {si}, not to [rows, {k}]")
    wd = dims(w)
    n = None if wd is None else wd[0 if attr(node, "transB", 0) else 1]
    lead = [d if d is not None else "?" for d in xd[:-1]]
    if len(so) != len(xd) or so[-1] not in (n, -1) or any(
            s not in (d, 0) for s, d in zip(so[:-1], lead, strict=True)):
        return fail(f"Linear: second Reshape to {so}, not back to {lead} + [{n}]")
    if b is not None and not _bias_broadcasts(b, rows, n):
        return fail("Linear: the Gemm bias is not one value per output feature")
    return True


def _prod(xs) -> int:
    out = 1
    for v in xs:
        out *= v
    return out


def _check(ctx, x, w, b, s_in=None, s_out=None, gemm=None, **_):
    if gemm is not None:
        return _check_reshaped_gemm(ctx, x, s_in, w, b, s_out, gemm)
    return _check_matmul_add(ctx, x, w, b)


def _gemm(op, x, w, b, gemm=None, **_):
    if gemm is not None or rank(x) != 2:
        return None  # no standard op for a batch of rows: the function form Linear
    return op.Gemm(x, w, b)


register(Rule("Linear", (reshaped_gemm, matmul_add), _check, standard=_gemm, opset=7,
              standard_op="Gemm", inputs=("x",), commute=False, priority=80,
              doc="nn.Linear / x @ W + b: Gemm on rank 2, the Linear function on a batch of "
                  "rows (MatMul + Add, or onnxslim's Reshape + Gemm + Reshape)"))
