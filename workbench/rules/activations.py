"""Activation rules: GELU (erf and tanh forms), SiLU/Swish, Hardswish, Hardsigmoid, Mish.

Forms seen in real exports (torch 2.13): the TorchScript exporter writes GELU as
``Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5)`` and the tanh form with ``x*x*x``; the dynamo
exporter as ``Mul(x, Mul(0.5, Add(...)))`` and the tanh form with ``Pow(x, 3)``; Hardswish
below opset 14 as ``Mul(x, HardSigmoid(x))``; Mish below 18 as ``Mul(x, Tanh(Softplus(x)))``.
Hand-written forms (``x * F.relu6(x + 3) / 6``) lower to Clip + Div and are matched too.
Constants are written second (the engine puts them there) and checked here.
"""

from __future__ import annotations

import math

from . import Rule, attr, close, fail, register, scalar

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_COEF = 0.044715


# -- GELU ----------------------------------------------------------------------------------

def _erf_arg(op, x, c_sqrt2):
    return op.Erf(op.Div(x, c_sqrt2))


def _erf_arg_mul(op, x, c_sqrt2):
    return op.Erf(op.Mul(x, c_sqrt2))  # x * (1/√2): c_sqrt2 binds 0.7071


def _gelu_patterns():
    """0.5·x·(1 + erf(x/√2)) in three associations, with Div(√2) or Mul(1/√2)."""
    out = []
    for arg in (_erf_arg, _erf_arg_mul):
        out += _gelu_erf_forms(arg)
    return out


def _gelu_erf_forms(arg):  # a factory: pattern parameters must all be pattern variables
    def outer(op, x, c_sqrt2, c_one, c_half):  # (x * (erf + 1)) * 0.5
        return op.Mul(op.Mul(x, op.Add(arg(op, x, c_sqrt2), c_one)), c_half)

    def inner(op, x, c_sqrt2, c_one, c_half):  # x * ((erf + 1) * 0.5)
        return op.Mul(x, op.Mul(op.Add(arg(op, x, c_sqrt2), c_one), c_half))

    def half_first(op, x, c_sqrt2, c_one, c_half):  # (x * 0.5) * (erf + 1)
        return op.Mul(op.Mul(x, c_half), op.Add(arg(op, x, c_sqrt2), c_one))

    return [outer, inner, half_first]


def _cube_pow(op, x, c_three):
    return op.Pow(x, c_three)


def _cube_mul(op, x, c_three):  # x * (x * x), as the TorchScript exporter writes x**3
    return op.Mul(x, op.Mul(x, x))


def _gelu_tanh_patterns():
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), cube as Pow or Mul, both associations."""
    out = []
    for cube in (_cube_pow, _cube_mul):
        out += _gelu_tanh_forms(cube)
    return out


def _gelu_tanh_forms(cube):
    def tanh_of(op, x, c_three, c_coef, c_k):
        return op.Tanh(op.Mul(op.Add(x, op.Mul(cube(op, x, c_three), c_coef)), c_k))

    def outer(op, x, c_three, c_coef, c_k, c_one, c_half):
        return op.Mul(op.Mul(x, op.Add(tanh_of(op, x, c_three, c_coef, c_k), c_one)), c_half)

    def inner(op, x, c_three, c_coef, c_k, c_one, c_half):
        return op.Mul(x, op.Mul(op.Add(tanh_of(op, x, c_three, c_coef, c_k), c_one), c_half))

    return [outer, inner]


def _check_gelu(ctx, x, c_sqrt2=None, c_one=None, c_half=None, c_three=None, c_coef=None,
                c_k=None, **_):
    if not close(scalar(c_one), 1.0):
        return fail(f"GELU: the constant added to erf/tanh is {scalar(c_one)}, not 1")
    if not close(scalar(c_half), 0.5):
        return fail(f"GELU: the outer factor is {scalar(c_half)}, not 0.5")
    if c_coef is None:  # erf form
        s = scalar(c_sqrt2)
        if not (close(s, SQRT2) or close(s, 1 / SQRT2)):
            return fail(f"GELU (erf): x is scaled by {s}, not √2 (or 1/√2)")
        if s is not None and close(s, SQRT2) != _is_div(ctx):
            return fail("GELU (erf): √2 must divide (or 1/√2 multiply)")
        return True
    if c_three is not None and scalar(c_three) is not None and not close(scalar(c_three), 3.0):
        return fail(f"GELU (tanh): power {scalar(c_three)}, not 3")
    if not close(scalar(c_coef), GELU_TANH_COEF):
        return fail(f"GELU (tanh): cubic coefficient {scalar(c_coef)}, not {GELU_TANH_COEF}")
    if not close(scalar(c_k), SQRT_2_OVER_PI):
        return fail(f"GELU (tanh): tanh argument scaled by {scalar(c_k)}, not √(2/π)")
    return True


def _is_div(ctx) -> bool:
    return any(n.op_type == "Div" for n in ctx.nodes)


def _gelu(op, x, c_coef=None, **_):
    return op.Gelu(x, approximate="none" if c_coef is None else "tanh")


register(Rule("GELU", (*_gelu_tanh_patterns(), *_gelu_patterns()), _check_gelu,
              standard=_gelu, opset=20, standard_op="Gelu", commute=True, priority=20,
              doc="F.gelu / nn.GELU, approximate='none' (erf) or 'tanh'"))


# -- Hardswish / Hardsigmoid ---------------------------------------------------------------

def _hsig_div(op, x, c_three, c_min, c_max, c_six):
    return op.Div(op.Clip(op.Add(x, c_three), c_min, c_max), c_six)


def _hsig_mul(op, x, c_three, c_min, c_max, c_six):  # ... * (1/6)
    return op.Mul(op.Clip(op.Add(x, c_three), c_min, c_max), c_six)


def _check_clip_form(ctx, x, c_three=None, c_min=None, c_max=None, c_six=None, **_):
    if not close(scalar(c_three), 3.0):
        return fail(f"hard sigmoid: offset {scalar(c_three)}, not 3")
    if not close(scalar(c_min), 0.0) or not close(scalar(c_max), 6.0):
        return fail(f"hard sigmoid: clip to [{scalar(c_min)}, {scalar(c_max)}], not [0, 6]")
    six = scalar(c_six)
    divides = any(n.op_type == "Div" for n in ctx.nodes)
    if not close(six, 6.0 if divides else 1 / 6):
        return fail(f"hard sigmoid: scale {six}, not {'/6' if divides else '*(1/6)'}")
    return True


def _check_hardsigmoid_node(ctx, x, hs=None, **_):
    node = hs.producer() if hs is not None else None
    alpha, beta = attr(node, "alpha", 0.2), attr(node, "beta", 0.5)
    if not (close(alpha, 1 / 6) and close(beta, 0.5)):
        return fail(f"HardSigmoid(alpha={alpha}, beta={beta}) is not torch's (1/6, 0.5)")
    return True


def _check_hardswish(ctx, x, hs=None, **kw):
    if hs is not None:
        return _check_hardsigmoid_node(ctx, x, hs)
    return _check_clip_form(ctx, x, **kw)


def _hswish_from_hsig(op, x):
    return op.Mul(x, op.HardSigmoid(x, _allow_other_attributes=True, _outputs=["hs"]))


def _hswish_whole(hsig):
    def whole(op, x, c_three, c_min, c_max, c_six):  # x * hardsigmoid(x)
        return op.Mul(x, hsig(op, x, c_three, c_min, c_max, c_six))
    return whole


def _hswish_patterns():
    out = [_hswish_from_hsig, *(_hswish_whole(h) for h in (_hsig_div, _hsig_mul))]

    def mul_first_div(op, x, c_three, c_min, c_max, c_six):  # x * relu6(x + 3) / 6
        return op.Div(op.Mul(x, op.Clip(op.Add(x, c_three), c_min, c_max)), c_six)

    def mul_first_mul(op, x, c_three, c_min, c_max, c_six):
        return op.Mul(op.Mul(x, op.Clip(op.Add(x, c_three), c_min, c_max)), c_six)

    return [*out, mul_first_div, mul_first_mul]


def _hardswish(op, x, **_):
    return op.HardSwish(x)


def _hardsigmoid(op, x, **_):
    return op.HardSigmoid(x, alpha=1 / 6, beta=0.5)


register(Rule("Hardswish", _hswish_patterns(), _check_hardswish, standard=_hardswish,
              opset=14, standard_op="HardSwish", commute=True, priority=30,
              doc="F.hardswish / nn.Hardswish: x * relu6(x + 3) / 6"))
register(Rule("Hardsigmoid", (_hsig_div, _hsig_mul), _check_clip_form, standard=_hardsigmoid,
              opset=6, standard_op="HardSigmoid", priority=31,
              doc="F.hardsigmoid / nn.Hardsigmoid: relu6(x + 3) / 6"))


# -- Mish, SiLU ----------------------------------------------------------------------------

def _mish(op, x):
    return op.Mul(x, op.Tanh(op.Softplus(x)))


def _mish_log(op, x, c_one):  # softplus written as log(exp(x) + 1)
    return op.Mul(x, op.Tanh(op.Log(op.Add(op.Exp(x), c_one))))


def _check_mish(ctx, x, c_one=None, **_):
    if c_one is not None and not close(scalar(c_one), 1.0):
        return fail(f"Mish: softplus adds {scalar(c_one)}, not 1")
    return True


register(Rule("Mish", (_mish, _mish_log), _check_mish, standard=lambda op, x, **_: op.Mish(x),
              opset=18, standard_op="Mish", commute=True, priority=40,
              doc="F.mish / nn.Mish: x * tanh(softplus(x))"))


def _silu(op, x):
    return op.Mul(x, op.Sigmoid(x))


def _check_silu(ctx, x, **_):
    return True  # no constants: x * sigmoid(x) is SiLU exactly


register(Rule("SiLU", _silu, _check_silu, standard=lambda op, x, **_: op.Swish(x), opset=24,
              standard_op="Swish", commute=True, priority=50,
              doc="F.silu / nn.SiLU / Swish: x * sigmoid(x)"))
