"""Normalization rules: GroupNorm, LayerNorm (as exported below opset 17), F.normalize.

Forms seen in real exports (torch 2.13, both exporters, before and after onnxslim):
- GroupNorm: ``Reshape(x, [N, G, -1])`` -> ``InstanceNormalization`` with unit scale and
  zero bias -> ``Reshape`` back (to ``Shape(x)`` or a constant shape) -> ``Mul`` by the
  per-channel weight -> ``Add`` the bias (the affine part absent for ``F.group_norm``
  without weight, or folded away by onnxslim).
- LayerNorm (TorchScript exporter below opset 17): ``ReduceMean`` -> ``Sub`` -> ``Pow 2``
  -> ``ReduceMean`` -> ``Add eps`` -> ``Sqrt`` -> ``Div`` [-> ``Mul`` weight -> ``Add`` bias].
- F.normalize: ``ReduceL2`` (keepdims) -> ``Clip(min=eps)`` [-> ``Expand`` to x's shape]
  -> ``Div``.

The standard forms: GroupNormalization (opset 21 semantics: scale and bias per channel)
and LayerNormalization (17). F.normalize has none and is always raised to the function
``normalize``: LpNormalization has no eps (it differs where a norm is below eps), and pnnx
cannot convert it to ncnn, while it converts the function (its body is what it knows).
"""

from __future__ import annotations

from . import (
    Rule,
    all_equal,
    attr,
    close,
    const,
    dims,
    fail,
    ints,
    last_axes,
    new_initializer,
    rank,
    register,
)

EPS_MAX = 1e-2  # a larger "eps" is not a numerical guard: the subgraph is something else


def _eps_ok(eps: float | None) -> bool:
    return eps is not None and 0.0 < eps <= EPS_MAX


def _scalar_const(value):
    arr = const(value)
    return None if arr is None or arr.size != 1 else float(arr.reshape(-1)[0])


def _per_channel(value, x, channels: int | None) -> bool:
    """A constant that broadcasts along axis 1 of x only (shape (C,1,..,1) or (1,C,1,..))."""
    arr = const(value)
    r = rank(x)
    if arr is None or r is None or arr.ndim > r:
        return False
    shape = (1,) * (r - arr.ndim) + tuple(arr.shape)
    c = shape[1]  # 1 is a scalar that broadcasts over every channel
    return all(s == 1 for i, s in enumerate(shape) if i != 1) and (channels is None
                                                                      or c in (1, channels))


# -- GroupNorm -----------------------------------------------------------------------------

def _gn_core(op, x, shape1, in_scale, in_bias, shape2):
    r = op.Reshape(x, shape1, _allow_other_attributes=True)
    n = op.InstanceNormalization(r, in_scale, in_bias, _outputs=["normed"])
    return op.Reshape(n, shape2)


def _gn_core_shape(op, x, shape1, in_scale, in_bias):
    r = op.Reshape(x, shape1)
    n = op.InstanceNormalization(r, in_scale, in_bias, _outputs=["normed"])
    return op.Reshape(n, op.Shape(x))


def gn_affine_shape(op, x, shape1, in_scale, in_bias, scale, bias):
    return op.Add(op.Mul(_gn_core_shape(op, x, shape1, in_scale, in_bias), scale), bias)


def gn_affine(op, x, shape1, in_scale, in_bias, shape2, scale, bias):
    return op.Add(op.Mul(_gn_core(op, x, shape1, in_scale, in_bias, shape2), scale), bias)


def gn_plain_shape(op, x, shape1, in_scale, in_bias):
    return _gn_core_shape(op, x, shape1, in_scale, in_bias)


def gn_plain(op, x, shape1, in_scale, in_bias, shape2):
    return _gn_core(op, x, shape1, in_scale, in_bias, shape2)


def _check_gn(ctx, x, shape1, in_scale, in_bias, normed, shape2=None, scale=None, bias=None):
    s1 = ints(shape1)
    if s1 is None or len(s1) != 3 or s1[2] != -1 or s1[1] <= 0:
        return fail(f"GroupNorm: first Reshape to {s1}, not [N, groups, -1]")
    groups = s1[1]
    if not all_equal(in_scale, 1.0) or not all_equal(in_bias, 0.0):
        return fail("GroupNorm: InstanceNormalization scale is not all ones or bias not all "
                    "zeros (a real InstanceNorm, not GroupNorm's lowering)")
    eps = attr(normed.producer(), "epsilon", 1e-5)
    if not _eps_ok(eps):
        return fail(f"GroupNorm: epsilon {eps} is not in (0, {EPS_MAX}]")
    xd = dims(x)
    if xd is None or len(xd) < 3:
        return fail("GroupNorm: the input's rank is unknown or below 3")
    if s1[0] not in (0, -1) and xd[0] not in (None, s1[0]):
        return fail(f"GroupNorm: first Reshape keeps batch {s1[0]}, the input has {xd[0]}")
    if shape2 is not None:
        s2 = ints(shape2)
        if s2 is None or s2 != xd:
            return fail(f"GroupNorm: second Reshape to {s2}, not back to the input's {xd}")
    channels = xd[1]
    if channels is None and scale is not None:
        arr = const(scale)
        channels = int(arr.size) if arr is not None else None
    if channels is not None and channels % groups:
        return fail(f"GroupNorm: {channels} channels do not split into {groups} groups")
    if scale is not None and not (_per_channel(scale, x, channels)
                                  and _per_channel(bias, x, channels)):
        return fail("GroupNorm: the affine Mul/Add are not per-channel constants")
    if channels is None:
        return fail("GroupNorm: the channel count is unknown")
    return True


def _group_norm(op, x, shape1, in_scale, normed, scale=None, bias=None, **_):
    import numpy as np

    groups = ints(shape1)[1]
    eps = attr(normed.producer(), "epsilon", 1e-5)
    dtype = const(in_scale).dtype
    channels = dims(x)[1]
    if channels is None:
        channels = int(const(scale).size)
    w = const(scale) if scale is not None else np.ones(channels, dtype)
    b = const(bias) if bias is not None else np.zeros(channels, dtype)
    w_c, b_c = (new_initializer(op, np.broadcast_to(a.reshape(-1), (channels,)).astype(dtype),
                                f"{n}_{channels}") for a, n in ((w, "gn_scale"), (b, "gn_bias")))
    return op.GroupNormalization(x, w_c, b_c, epsilon=float(eps), num_groups=int(groups))


register(Rule("GroupNorm", (gn_affine_shape, gn_affine, gn_plain_shape, gn_plain), _check_gn,
              standard=_group_norm, opset=21, standard_op="GroupNormalization",
              inputs=("x", "scale", "bias"), priority=10,
              doc="nn.GroupNorm / F.group_norm (InstanceNormalization with unit scale, "
                  "zero bias between two Reshapes)"))


# -- LayerNorm -----------------------------------------------------------------------------

def _ln_core(op, x, c_two, c_eps, square):
    mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
    d = op.Sub(x, mean)
    sq = op.Pow(d, c_two) if square == "pow" else op.Mul(d, d)
    var = op.ReduceMean(sq, _allow_other_inputs=True, _outputs=["var"])
    return op.Div(d, op.Sqrt(op.Add(var, c_eps)))


def _ln_forms(square):
    def ln_affine(op, x, c_two, c_eps, scale, bias):
        return op.Add(op.Mul(_ln_core(op, x, c_two, c_eps, square), scale), bias)

    def ln_scale(op, x, c_two, c_eps, scale):
        return op.Mul(_ln_core(op, x, c_two, c_eps, square), scale)

    def ln_plain(op, x, c_two, c_eps):
        return _ln_core(op, x, c_two, c_eps, square)

    return ln_affine, ln_scale, ln_plain


def _reduce_axes(node) -> list[int] | None:
    """Axes of a Reduce* node: the attribute (opset < 18) or the second input (18+)."""
    a = attr(node, "axes")
    if a is not None:
        return list(a)
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return ints(node.inputs[1])
    return None


def _check_ln(ctx, x, mean, var, c_eps, c_two=None, scale=None, bias=None):
    m, v = mean.producer(), var.producer()
    axes_m, axes_v = _reduce_axes(m), _reduce_axes(v)
    if axes_m is None or axes_m != axes_v:
        return fail(f"LayerNorm: mean over axes {axes_m}, variance over {axes_v}")
    if attr(m, "keepdims", 1) != 1 or attr(v, "keepdims", 1) != 1:
        return fail("LayerNorm: a ReduceMean drops its axes (keepdims=0)")
    r = rank(x)
    if r is None:
        return fail("LayerNorm: the input's rank is unknown")
    axes = sorted(a % r for a in axes_m)
    if c_two is not None and not close(_scalar_const(c_two), 2.0):
        return fail(f"LayerNorm: variance uses power {_scalar_const(c_two)}, not 2")
    eps = _scalar_const(c_eps)
    if not _eps_ok(eps):
        return fail(f"LayerNorm: eps {eps} is not in (0, {EPS_MAX}]")
    xd = dims(x)
    for name, value in (("weight", scale), ("bias", bias)):
        if value is None:
            continue
        arr = const(value)
        if arr is None or arr.ndim > r:
            return fail(f"LayerNorm: {name} is not a constant that broadcasts onto the input")
        shape = (1,) * (r - arr.ndim) + tuple(arr.shape)
        for i, n in enumerate(shape):
            if n != 1 and (i not in axes or xd[i] not in (None, n)):
                return fail(f"LayerNorm: {name} shape {list(arr.shape)} varies outside the "
                            f"normalized axes {axes_m}")
    return True


def _layer_norm(op, x, mean, c_eps, scale=None, bias=None, **_):
    """LayerNormalization over the trailing axes; None (-> the function form) otherwise."""
    import numpy as np

    r = rank(x)
    k = last_axes(_reduce_axes(mean.producer()), r)
    if k is None:
        return None  # e.g. ConvNeXt's channels-first LayerNorm: no standard op for it
    norm_dims = dims(x)[-k:]
    dtype = const(c_eps).dtype
    if any(d is None for d in norm_dims):
        return None  # the scale must have the normalized shape: unknown here
    inputs = []
    for value, hint in ((scale, "ln_scale"), (bias, "ln_bias")):
        if value is None and hint == "ln_bias":
            continue  # the bias input is optional
        arr = const(value) if value is not None else np.ones(norm_dims, dtype)
        if value is not None and tuple(arr.shape) == tuple(norm_dims):
            inputs.append(value)
        else:
            full = np.broadcast_to(arr.reshape(arr.shape[-k:] if arr.ndim >= k else arr.shape),
                                   norm_dims)
            inputs.append(new_initializer(op, full.astype(dtype), hint))
    return op.LayerNormalization(x, *inputs, axis=-k, epsilon=float(_scalar_const(c_eps)))


register(Rule("LayerNorm", (*_ln_forms("pow"), *_ln_forms("mul")), _check_ln,
              standard=_layer_norm, opset=17, standard_op="LayerNormalization",
              inputs=("x", "scale", "bias"), priority=11,
              doc="nn.LayerNorm / F.layer_norm as exported below opset 17"))


# -- F.normalize ---------------------------------------------------------------------------

def _l2(op, x, c_eps):
    n = op.ReduceL2(x, _allow_other_inputs=True, _outputs=["norm"])
    return op.Clip(n, c_eps, _allow_other_inputs=True, _outputs=["clipped"])


def normalize_expand_shape(op, x, c_eps):
    return op.Div(x, op.Expand(_l2(op, x, c_eps), op.Shape(x)))


def normalize_expand(op, x, c_eps, c_shape):
    return op.Div(x, op.Expand(_l2(op, x, c_eps), c_shape))


def normalize_expand_dynamic(op, x, c_eps, shape):  # the shape computed at run time
    return op.Div(x, op.Expand(_l2(op, x, c_eps), shape, _outputs=["expanded"]))


def normalize_plain(op, x, c_eps):
    return op.Div(x, _l2(op, x, c_eps))


def _check_normalize(ctx, x, norm, clipped, c_eps, c_shape=None, shape=None, expanded=None):
    node = norm.producer()
    axes = _reduce_axes(node)
    if axes is None or len(axes) != 1:
        return fail(f"normalize: the L2 norm is over axes {axes}, not one dim")
    if attr(node, "keepdims", 1) != 1:
        return fail("normalize: ReduceL2 drops its axis (keepdims=0)")
    clip = clipped.producer()
    if len(clip.inputs) > 2 and clip.inputs[2] is not None:
        return fail("normalize: the norm is clipped from above too")
    eps = _scalar_const(c_eps)
    if not _eps_ok(eps):
        return fail(f"normalize: eps {eps} is not in (0, {EPS_MAX}]")
    if c_shape is not None:
        s, xd = ints(c_shape), dims(x)
        if s is None or xd is None or s != xd:
            return fail(f"normalize: the norm is expanded to {s}, not to the input's {xd}")
    if shape is not None and not _same_shape(expanded, x):
        # a shape computed at run time (dynamic axes) must give x's own shape
        return fail("normalize: the norm is expanded to a shape not known to be the input's")
    return True


def _same_shape(a, b) -> bool:
    """Two values whose shapes are fully known and equal (same ints, same symbolic names)."""
    sa, sb = getattr(a, "shape", None), getattr(b, "shape", None)
    if sa is None or sb is None or len(sa) != len(sb):
        return False
    return all(isinstance(d, int) or getattr(d, "value", None) for d in sa) and \
        [d if isinstance(d, int) else d.value for d in sa] == \
        [d if isinstance(d, int) else getattr(d, "value", None) for d in sb]


register(Rule("normalize", (normalize_expand_shape, normalize_expand, normalize_expand_dynamic,
                            normalize_plain),
              _check_normalize, priority=12, inputs=("x", "shape"),
              doc="F.normalize(x, p=2, dim=d): x / max(||x||_2, eps) along d"))
