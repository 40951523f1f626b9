"""The order of evidence that ties a stored weight to its module (workbench/comparison/
identity.py), each on small hand-made weights: names, structure, neighbourhood, values (only
between equal shapes), one owner, position; destroyed values never untie a weight."""

from __future__ import annotations

import numpy as np

from workbench.comparison.identity import Param, Stored, identify


def _w(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _params(*specs):
    """Param per (module, array), ranked in the order given."""
    return [Param(m, "weight", r, w) for r, (m, w) in enumerate(specs)]


def _conv(key, w, *, values=None, name=None, near=(), kind="Convolution"):
    """A stored conv weight declaring w's rows and kernel, holding ``values`` (w itself)."""
    data = (w if values is None else values).ravel().astype(np.float32)
    kernel = int(np.prod(w.shape[2:])) if w.ndim > 2 else None
    return Stored(key, f"layer{key}", kind, w.size, lambda d=data: d, rows=w.shape[0],
                  kernel=kernel, name=name, near=near)


def _tied(stored, params):
    return {stored[k].layer: (t.module, t.evidence) for k, t in identify(stored, params).items()}


def test_a_unique_shape_ties_a_destroyed_weight_without_its_values():
    a, b, c = _w(0, 16, 3, 3, 3), _w(1, 32, 16, 3, 3), _w(2, 8, 32, 1, 1)
    params = _params(("a", a), ("b", b), ("c", c))
    noise = _w(9, *b.shape)
    stored = [_conv(0, a), _conv(1, b, values=noise), _conv(2, c)]
    assert _tied(stored, params)["layer1"] == ("b", "structure")


def test_declared_rows_and_kernel_tell_equal_counts_apart():
    # 64*128*3 == 128*64*3 (silero-vad's conv2 and conv4); 16*128*64 == 64*32*64
    p = _params(("conv2", _w(0, 64, 128, 3)), ("conv4", _w(1, 128, 64, 3)),
                ("x", _w(2, 16, 128, 64)), ("y", _w(3, 64, 32, 64)))
    stored = [_conv(k, p[k].value, values=_w(10 + k, p[k].value.size)) for k in range(4)]
    assert {layer: m for layer, (m, _) in _tied(stored, p).items()} == {
        "layer0": "conv2", "layer1": "conv4", "layer2": "x", "layer3": "y"}


def test_a_name_ties_one_of_equal_shapes_whatever_the_values():
    w = _w(0, 16, 16, 3, 3)
    params = _params(("conv3", w), ("conv4", w.copy()))
    stored = [_conv(0, w, values=_w(5, *w.shape), name="conv3"),
              _conv(1, w, values=_w(6, *w.shape), name="conv4")]
    assert _tied(stored, params) == {"layer0": ("conv3", "name"), "layer1": ("conv4", "name")}


def test_values_break_a_tie_between_equal_shapes():
    a, b = _w(0, 32, 32, 3, 3), _w(1, 32, 32, 3, 3)
    params = _params(("a", a), ("b", b))
    stored = [_conv(0, b), _conv(1, a)]  # the graph holds them crosswise: values say so
    assert _tied(stored, params) == {"layer0": ("b", "values"), "layer1": ("a", "values")}


def test_a_destroyed_weight_takes_the_equal_shape_nobody_else_holds():
    a, b = _w(0, 32, 32, 3, 3), _w(1, 32, 32, 3, 3)
    params = _params(("a", a), ("b", b))
    stored = [_conv(0, b), _conv(1, a, values=_w(7, *a.shape))]  # crosswise, one destroyed
    assert _tied(stored, params) == {"layer0": ("b", "values"), "layer1": ("a", "one owner")}


def test_copies_with_equal_values_are_placed_by_position():
    """Two deep copies (equal shapes, equal values) between anchors of unique shape: the
    order decides, the first layer is the first module."""
    stem, w, head = _w(0, 8, 3, 3, 3), _w(1, 8, 8, 3, 3), _w(2, 4, 8, 1, 1)
    params = _params(("stem", stem), ("a", w), ("b", w.copy()), ("head", head))
    stored = [_conv(0, stem), _conv(1, w), _conv(2, w, values=_w(8, *w.shape)),
              _conv(3, head)]
    assert _tied(stored, params) == {"layer0": ("stem", "structure"),
                                     "layer1": ("a", "position"), "layer2": ("b", "position"),
                                     "layer3": ("head", "structure")}


def test_position_leaves_a_weight_untied_when_the_order_allows_two_modules():
    stem, w = _w(0, 8, 3, 3, 3), _w(1, 8, 8, 3, 3)
    params = _params(("stem", stem), ("a", w), ("b", w.copy()), ("c", w.copy()))
    stored = [_conv(0, stem), _conv(1, w, values=_w(8, *w.shape)),
              _conv(2, w, values=_w(9, *w.shape))]  # two layers for three modules
    tied = _tied(stored, params)
    assert "layer1" not in tied and "layer2" not in tied


def test_neighbours_narrow_equal_shapes_to_their_block():
    w = _w(1, 8, 8, 3, 3)
    params = _params(("blocks.0.conv", w), ("blocks.0.act", _w(2, 1, 1)),
                     ("blocks.1.conv", w.copy()), ("blocks.1.act", _w(3, 1, 1)))
    stored = [_conv(0, w, values=_w(8, *w.shape), near=("blocks.1.act",))]
    assert _tied(stored, params) == {"layer0": ("blocks.1.conv", "neighbourhood")}


def test_values_that_match_another_shape_outright_overrule_the_shape_rules():
    """A layer whose declared rows the rules misread: its intact values match a parameter
    of the same size but another shape; that one, not the shape's."""
    a, b = _w(0, 6, 4), _w(1, 4, 6)
    params = _params(("a", a), ("b", b))
    stored = [Stored(0, "ip", "InnerProduct", 24, lambda: b.ravel().copy(), rows=6)]
    assert _tied(stored, params) == {"ip": ("b", "values")}


def test_an_undeclared_constant_is_tied_by_values_only():
    """A Gemm's constant declares no shape (it may be a buffer or the converter's own):
    a size alone never ties it."""
    a = _w(0, 6, 4)
    params = _params(("a", a))
    other = Stored(0, "gemm", "Gemm", 24, lambda: _w(5, 24))
    same = Stored(1, "gemm2", "Gemm", 24, lambda: a.ravel().copy())
    assert _tied([other, same], params) == {"gemm2": ("a", "values")}


def test_a_module_called_twice_is_held_by_both_of_its_layers():
    w, x = _w(0, 8, 8, 3, 3), _w(1, 8, 8, 3, 3)
    params = _params(("shared", w), ("other", x))
    stored = [_conv(0, w), _conv(1, w), _conv(2, x)]
    assert {k: m for k, (m, _) in _tied(stored, params).items()} == {
        "layer0": "shared", "layer1": "shared", "layer2": "other"}


def _attention(block, key, weights, values=None, near=()):
    """A fused attention layer's four projection weights (q, k, v, out, in that order, as
    ncnn's MultiHeadAttention loads them): no shape declared, one layer."""
    held = [(values or {}).get(i, w).ravel().copy() for i, w in enumerate(weights)]
    return [Stored(key + i, f"attention{block}", "MultiHeadAttention", w.size,
                   lambda d=d: d, near=near)
            for i, (w, d) in enumerate(zip(weights, held, strict=True))]


def test_a_destroyed_projection_of_a_fused_attention_is_placed_by_its_layers_order():
    """Two blocks of equal-shaped q, k, v, out projections; block 1's q (or its out) is
    noise: the layer's other weights are tied by values, so the layer holds module weights,
    and the untied one takes the projection between its neighbours in module order, though
    the module named at what the layer reads is the block before's."""
    blocks = [[_w(10 * b + i, 8, 8) for i in range(4)] for b in range(2)]
    ffn = [_w(50 + b, 16, 8) for b in range(2)]
    names = ("query", "key", "value", "out")
    params = _params(*[spec for b in range(2) for spec in (
        *((f"layer.{b}.{p}", w) for p, w in zip(names, blocks[b], strict=True)),
        (f"layer.{b}.ffn", ffn[b]))])
    for damaged in (0, 3):
        stored = (_attention(0, 0, blocks[0])
                  + [Stored(4, "ffn0", "InnerProduct", 128, lambda: ffn[0].ravel(), rows=16)]
                  + _attention(1, 5, blocks[1], {damaged: _w(99, 8, 8)},
                               near=("layer.0.ffn",))
                  + [Stored(9, "ffn1", "InnerProduct", 128, lambda: ffn[1].ravel(), rows=16)])
        ties = identify(stored, params)
        assert ties[5 + damaged].module == f"layer.1.{names[damaged]}"
        assert ties[5 + damaged].evidence == "position"


def test_an_undeclared_weight_alone_in_its_layer_is_not_placed_by_position():
    """A constant of its own layer (a Gemm's B, maybe a buffer or the converter's own)
    between placed weights: its size alone never ties it."""
    a, b, c = _w(0, 8, 3, 3, 3), _w(1, 6, 4), _w(2, 4, 8, 1, 1)
    params = _params(("a", a), ("b", b), ("c", c))
    stored = [_conv(0, a), Stored(1, "gemm", "Gemm", 24, lambda: _w(5, 24)), _conv(2, c)]
    assert "gemm" not in _tied(stored, params)
