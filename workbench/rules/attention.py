"""Scaled-dot-product attention: ``softmax(q @ k^T * scale [+ mask]) @ v`` back to one op.

Forms seen in real exports (torch 2.13; ViT, BERT, Swin and hand-written attention; both
exporters, before and after onnxslim):
- the scale on the scores (``Mul``/``Div`` after the first MatMul: BERT's eager attention,
  timm), on q alone, or split as ``sqrt(scale)`` on q and on k^T (the TorchScript export
  of ``F.scaled_dot_product_attention``);
- k^T as ``Transpose(k, [0,1,3,2])``, as ``Transpose(k_bshd, [0,2,3,1])`` when the head
  split's transpose was folded in, or as ``Reshape -> Transpose([0,2,1]) -> Reshape``
  (the dynamo exporter);
- an optional additive mask (``Add`` before the Softmax: a relative position bias, a
  causal or padding mask) and the dynamo exporter's NaN guard ``Where(IsNaN(p), 0, p)``
  after the Softmax;
- around it, the head split (``Reshape`` to [B, S, heads, head_dim] and ``Transpose`` to
  [B, heads, S, head_dim] for q, k, v) and the head merge (``Transpose`` back and
  ``Reshape`` to [.., heads * head_dim]): the longer pattern takes them in too, so the
  raised op reads like ``F.scaled_dot_product_attention`` on the projected q, k, v.

The check refuses a match whose scale is not ``1/sqrt(head_dim)`` when the head dim can be
read (another scale is another computation), whose Softmax is not over the last axis, or
whose head split does not agree between q, k and v. The standard form is ONNX
``Attention`` (opset 23; 4D inputs, or 3D with ``q_num_heads`` for the head-split form);
below opset 23, or with both a mask and the NaN guard (a fully masked row would read NaN
instead of 0), it is the function ``pkg.workbench::scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

from onnxscript.rewriter import pattern as _p

from . import Rule, attr, close, const, dims, fail, ints, new_initializer, register

NAME = "scaled_dot_product_attention"
BHSD = [0, 2, 1, 3]


def _scaled(op, x, c, tag):
    return _p.OrValue([op.Mul(x, c), op.Div(x, c), x], tag_var=tag,
                      tag_values=["Mul", "Div", "None"])


def _core(op, q4, kt, v4, mask, q_scale, k_scale, s_scale, nan_zero):
    scores = op.MatMul(_scaled(op, q4, q_scale, "q_scaling"),
                       _scaled(op, kt, k_scale, "k_scaling"))
    scores = _scaled(op, scores, s_scale, "s_scaling")
    scores = _p.OrValue([op.Add(scores, mask), scores], tag_var="has_mask",
                        tag_values=[True, False])
    probs = op.Softmax(scores, _allow_other_attributes=True, _outputs=["probs"])
    probs = _p.OrValue([op.Where(op.IsNaN(probs), nan_zero, probs), probs],
                       tag_var="nan_guard", tag_values=[True, False])
    return op.MatMul(probs, v4)


def _kt_of_bhsd(op, k):
    """k^T from a [B, H, S, d] key: a Transpose, or the dynamo exporter's 3D detour."""
    return _p.OrValue([
        op.Transpose(k, perm=[0, 1, 3, 2]),
        op.Reshape(op.Transpose(op.Reshape(k, _p.ANY_VALUE), perm=[0, 2, 1]), _p.ANY_VALUE),
    ], tag_var="k_form", tag_values=["BHSd", "3d"])


def sdpa_heads(op, q, k, v, q_shape, k_shape, v_shape, o_shape, mask, q_scale, k_scale,
               s_scale, nan_zero):
    """Head split of q, k, v + attention + head merge (the projected q, k, v in)."""
    q4 = op.Transpose(op.Reshape(q, q_shape, _allow_other_attributes=True), perm=BHSD)
    v4 = op.Transpose(op.Reshape(v, v_shape, _allow_other_attributes=True), perm=BHSD)
    kr = op.Reshape(k, k_shape, _allow_other_attributes=True)
    kt = _p.OrValue([op.Transpose(kr, perm=[0, 2, 3, 1]),
                     _kt_of_bhsd(op, op.Transpose(kr, perm=BHSD))],
                    tag_var="k_split", tag_values=["folded", "separate"])
    out = _core(op, q4, kt, v4, mask, q_scale, k_scale, s_scale, nan_zero)
    return op.Reshape(op.Transpose(out, perm=BHSD), o_shape, _allow_other_attributes=True,
                      _outputs=["merged"])


def sdpa(op, q, k, v, mask, q_scale, k_scale, s_scale, nan_zero):
    """Attention on [B, H, S, d] q and v; k as [B, H, S, d] or [B, S, H, d]."""
    kt = _p.OrValue([_kt_of_bhsd(op, k), op.Transpose(k, perm=[0, 2, 3, 1])],
                    tag_var="k_layout", tag_values=["BHSd", "BSHd"])
    return _core(op, q, kt, v, mask, q_scale, k_scale, s_scale, nan_zero)


# -- checks --------------------------------------------------------------------------------

def _factor(kind: str | None, value) -> float | None:
    """The factor a Mul/Div/None scaling applies (None when not a scalar constant)."""
    if kind in (None, "None"):
        return 1.0
    arr = const(value)
    if arr is None or arr.size != 1:
        return None
    v = float(arr.reshape(-1)[0])
    if kind == "Div":
        return None if v == 0 else 1.0 / v
    return v


def total_scale(b: dict) -> float | None:
    """The product of every scaling the match applies to q @ k^T (None if one is unknown)."""
    out = 1.0
    for kind, value in (("q_scaling", "q_scale"), ("k_scaling", "k_scale"),
                        ("s_scaling", "s_scale")):
        f = _factor(b.get(kind), b.get(value))
        if f is None:
            return None
        out *= f
    return out


def _softmax_last(ctx, probs) -> str | None:
    node = probs.producer()
    opset = ctx.model.opset_imports.get("", 13) if ctx.model is not None else 13
    axis = attr(node, "axis", -1 if opset >= 13 else 1)
    r = len(dims(probs) or []) or 4  # q @ k^T of 4D heads: rank 4 when not recorded
    if axis % r != r - 1:
        return f"the Softmax is over axis {axis} of a rank-{r} tensor, not the last one"
    return None


def _heads(b: dict) -> tuple[int, int, int] | str:
    """(heads, head_dim of q/k, head_dim of v) from the head-split Reshape shapes."""
    shapes = {n: ints(b.get(f"{n}_shape")) for n in ("q", "k", "v")}
    if any(s is None or len(s) != 4 for s in shapes.values()):
        return f"head split Reshapes to {list(shapes.values())}, not constant [B, S, H, d]"
    split = {}
    for n, s in shapes.items():
        h, d = s[2:]
        if h == -1:  # view(b, s, -1, head_dim): the head count follows from the features
            xd = dims(b.get(n))
            feats = xd[-1] if xd else None
            if feats is None or d <= 0 or feats % d:
                return f"{n}'s head count is -1 and its features are unknown"
            h = feats // d
        split[n] = (h, d)
    (hq, dq), (hk, dk), (hv, dv) = (split[n] for n in ("q", "k", "v"))
    if min(hq, dq, hk, dk, hv, dv) <= 0 or not hq == hk == hv or dq != dk:
        return (f"head splits disagree: q [H={hq}, d={dq}], k [H={hk}, d={dk}], "
                f"v [H={hv}, d={dv}]")
    o = ints(b.get("o_shape"))
    if o is None or len(o) not in (2, 3) or o[-1] not in (hq * dv, -1) or o.count(-1) > 1:
        return f"head merge Reshapes to {o}, not [.., {hq} * {dv}]"
    for n, (h, d) in (("q", (hq, dq)), ("k", (hk, dk)), ("v", (hv, dv))):
        xd = dims(b.get(n))
        if xd and xd[-1] is not None and xd[-1] != h * d:
            return f"{n} has {xd[-1]} features, its head split makes {h} x {d}"
    return hq, dq, dv


def check(ctx, q, k, v, probs, **b):
    why = _softmax_last(ctx, probs)
    if why:
        return fail(f"attention: {why}")
    if b.get("nan_guard"):
        zero = const(b.get("nan_zero"))
        if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0:
            return fail("attention: the NaN guard after the Softmax does not write 0")
    if "o_shape" in b and b.get("o_shape") is not None:
        heads = _heads({"q": q, "k": k, "v": v, **b})
        if isinstance(heads, str):
            return fail(f"attention: {heads}")
        head_dim = heads[1]
    else:
        qd = dims(q)
        if qd is not None and len(qd) != 4:
            return fail(f"attention: q has rank {len(qd)}, not 4 ([B, heads, S, head_dim])")
        head_dim = qd[-1] if qd else None
    scale = total_scale(b)
    if scale is None:
        return fail("attention: a scale is not a scalar constant")
    if head_dim is not None and not close(scale, 1 / math.sqrt(head_dim), rtol=1e-3):
        return fail(f"attention: scale {scale:.6g} is not 1/sqrt(head_dim) = "
                    f"{1 / math.sqrt(head_dim):.6g} for head_dim {head_dim}")
    return True


# -- the standard form: ONNX Attention (opset 23) -------------------------------------------

def standard(op, q, k, v, mask=None, **b):
    if b.get("nan_guard") and b.get("has_mask"):
        return None  # Attention would give NaN for a fully masked row: keep the function
    scale = total_scale(b)
    extra = [mask] if b.get("has_mask") else []
    if b.get("o_shape") is not None:
        heads, d, dv = _heads({"q": q, "k": k, "v": v, **b})
        q3, k3, v3 = (op.Reshape(x, _merge_shape(op, b[f"{n}_shape"], heads * hd))
                      for x, n, hd in ((q, "q", d), (k, "k", d), (v, "v", dv)))
        out = op.Attention(q3, k3, v3, *extra, q_num_heads=heads, kv_num_heads=heads,
                           scale=float(scale))
        return op.Reshape(out, b["o_shape"])
    if b.get("k_layout") == "BSHd":
        k = op.Transpose(k, perm=BHSD)
    return op.Attention(q, k, v, *extra, scale=float(scale))


def _merge_shape(op, split_shape, features: int):
    """[B, S, H, d] -> a constant [B, S, H*d] (the same 0/-1 in the first two places)."""
    import numpy as np

    s = ints(split_shape)
    return new_initializer(op, np.array([s[0], s[1], features], dtype=np.int64), "attn_shape")


register(Rule(NAME, (sdpa_heads, sdpa), check, standard=standard, opset=23,
              standard_op="Attention", inputs=("q", "k", "v", "mask"), priority=50,
              doc="F.scaled_dot_product_attention / softmax(q @ k^T * scale + mask) @ v, with "
                  "the head split and merge around it when present"))
