"""Layout rules: PixelShuffle (Reshape + Transpose + Reshape) and YOLOv5's Focus (four
strided slices + Concat), back to DepthToSpace / SpaceToDepth.

Forms seen in real exports (torch 2.13):
- PixelShuffle: ``nn.PixelShuffle`` exports as ``DepthToSpace`` from opset 11 (TorchScript)
  and with the dynamo exporter, but at opset 9, or written by hand (``view`` to
  [N, C/r², r, r, H, W], ``permute(0, 1, 4, 2, 5, 3)``, ``reshape`` to [N, C/r², H·r, W·r]),
  it is ``Reshape -> Transpose -> Reshape``. That is DepthToSpace mode CRD; the permutation
  (0, 3, 4, 1, 5, 2) of [N, r, r, C/r², H, W] is mode DCR.
- Focus: ``torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2],
  x[..., 1::2, 1::2]], 1)``. onnxslim merges each pair of slices into one ``Slice`` over
  axes [2, 3] with steps [2, 2]; the exporters write two nested Slices (rows, then columns).

SpaceToDepth(blocksize 2) puts the block at row offset dy, column offset dx at channel
group ``dy * 2 + dx``: the order (0,0), (0,1), (1,0), (1,1). YOLOv5's concat order is
(0,0), (1,0), (0,1), (1,1), so its Focus is SpaceToDepth followed by a channel
permutation (a Gather on axis 1). The check reads the order from the slices' starts and
raises to plain SpaceToDepth only when it is SpaceToDepth's own; any other order of the
four offsets gets the Gather that puts it right; anything else (a repeated offset, a
step other than 2, other axes) is refused. Function form: ``pkg.workbench::Focus`` /
``pkg.workbench::PixelShuffle``.
"""

from __future__ import annotations

from . import Rule, attr, dims, fail, ints, new_initializer, register

S2D_ORDER = ((0, 0), (0, 1), (1, 0), (1, 1))  # (row, column) offset of each channel group
CRD = [0, 1, 4, 2, 5, 3]  # [N, C, r, r, H, W] -> [N, C, H, r, W, r]
DCR = [0, 3, 4, 1, 5, 2]  # [N, r, r, C, H, W] -> [N, C, H, r, W, r]


def _resolve(shape: list[int], in_dims: list[int], allowzero: int) -> list[int] | None:
    """The output dims of Reshape(x, shape) for an input of ``in_dims`` (0 copies, -1 infers)."""
    out = [in_dims[i] if s == 0 and not allowzero and i < len(in_dims) else s
           for i, s in enumerate(shape)]
    total = 1
    for d in in_dims:
        total *= d
    if out.count(-1) > 1 or any(d < -1 for d in out):
        return None
    if -1 in out:
        known = 1
        for d in out:
            known *= d if d != -1 else 1
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    return out


# -- PixelShuffle ----------------------------------------------------------------------------

def pixel_shuffle(op, x, s1, s2):
    r1 = op.Reshape(x, s1, _allow_other_attributes=True, _outputs=["split"])
    t = op.Transpose(r1, _allow_other_attributes=True, _outputs=["moved"])
    return op.Reshape(t, s2, _allow_other_attributes=True, _outputs=["merged"])


def _shuffle(x, s1, s2, split, moved, merged) -> tuple[int, str] | str:
    xd = dims(x)
    if xd is None or len(xd) != 4 or any(d is None for d in xd):
        return "the input is not rank 4 with known dims"
    a, b = ints(s1), ints(s2)
    if a is None or b is None or len(a) != 6 or len(b) != 4:
        return f"Reshapes to {a} and {b}, not 6D then 4D"
    perm = list(attr(moved.producer(), "perm", []) or [])
    mode = "CRD" if perm == CRD else "DCR" if perm == DCR else None
    if mode is None:
        return f"Transpose perm {perm} is neither CRD {CRD} nor DCR {DCR}"
    six = _resolve(a, xd, attr(split.producer(), "allowzero", 0))
    if six is None:
        return f"first Reshape to {a} does not fit the input {xd}"
    n, c, h, w = xd
    r = six[2] if mode == "CRD" else six[1]
    if r < 2 or c % (r * r):
        return f"block {r} does not divide {c} channels into r*r groups"
    want = ([n, c // (r * r), r, r, h, w] if mode == "CRD" else [n, r, r, c // (r * r), h, w])
    if six != want:
        return f"first Reshape makes {six}, {mode} needs {want}"
    four = _resolve(b, [six[i] for i in perm], attr(merged.producer(), "allowzero", 0))
    if four != [n, c // (r * r), h * r, w * r]:
        return f"second Reshape makes {four}, not [{n}, {c // (r * r)}, {h * r}, {w * r}]"
    return r, mode


def check_shuffle(ctx, x, s1, s2, split, moved, merged):
    got = _shuffle(x, s1, s2, split, moved, merged)
    return fail(f"PixelShuffle: {got}") if isinstance(got, str) else True


def depth_to_space(op, x, s1, s2, split, moved, merged, **_):
    r, mode = _shuffle(x, s1, s2, split, moved, merged)
    return op.DepthToSpace(x, blocksize=int(r), mode=mode)


register(Rule("PixelShuffle", pixel_shuffle, check_shuffle, standard=depth_to_space, opset=11,
              standard_op="DepthToSpace", inputs=("x",), priority=60,
              doc="nn.PixelShuffle / F.pixel_shuffle as Reshape + Transpose + Reshape -> "
                  "DepthToSpace (CRD; DCR for the other permutation)"))


# -- Focus -------------------------------------------------------------------------------------

def focus_merged(op, x):
    parts = [op.Slice(x, _allow_other_inputs=True, _outputs=[f"p{i}"]) for i in range(4)]
    return op.Concat(*parts, _allow_other_attributes=True, _outputs=["cat"])


def _nested(order):
    """The exporters' form: two row Slices of x, each sliced by columns twice."""
    def focus_nested(op, x):
        rows = [op.Slice(x, _allow_other_inputs=True, _outputs=[f"r{i}"]) for i in range(2)]
        parts = [op.Slice(rows[ri], _allow_other_inputs=True, _outputs=[f"p{i}"])
                 for i, ri in enumerate(order)]
        return op.Concat(*parts, _allow_other_attributes=True, _outputs=["cat"])

    focus_nested.__name__ = f"focus_nested_{''.join(map(str, order))}"
    return focus_nested


def _slice_spec(node, rank: int) -> dict[int, tuple[int, int, int]] | None:
    """{axis: (start, end, step)} of a Slice with constant inputs (opset >= 10 form)."""
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = ints(ins[1]), ints(ins[2])
    axes = ints(ins[3]) if ins[3] is not None else list(range(len(starts or [])))
    steps = ints(ins[4]) if ins[4] is not None else [1] * len(starts or [])
    if None in (starts, ends, axes, steps) or not len(starts) == len(ends) == len(axes) \
            == len(steps):
        return None
    return {a % rank: (s, e, st) for a, s, e, st in zip(axes, starts, ends, steps, strict=True)}


def _offset(spec: dict[int, tuple[int, int, int]], dim_of: dict[int, int | None],
            axes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The start offsets along ``axes`` if the slice keeps every 2nd element to the end."""
    if sorted(spec) != sorted(axes):
        return None
    out = []
    for a in axes:
        start, end, step = spec[a]
        full = dim_of.get(a)
        if step != 2 or start not in (0, 1) or not (end >= 2**31 - 1 or
                                                     (full is not None and end >= full)):
            return None
        out.append(start)
    return tuple(out)


def focus_order(x, cat, p0, p1, p2, p3, r0=None, r1=None) -> list[tuple[int, int]] | str:
    """The (row, column) offset of each concatenated part, in concat order."""
    xd = dims(x)
    if xd is None or len(xd) != 4:
        return "the input is not rank 4"
    node = cat.producer()
    if attr(node, "axis", None) not in (1, -3):
        return f"Concat on axis {attr(node, 'axis', None)}, not the channels"
    h, w = xd[2], xd[3]
    if (h is not None and h % 2) or (w is not None and w % 2):
        return f"odd spatial size {h}x{w}"
    dim_of = {2: h, 3: w}
    parts = [p0, p1, p2, p3]
    order = []
    for p in parts:
        if r0 is None:  # merged form: one Slice over both axes
            spec = _slice_spec(p.producer(), 4)
            off = _offset(spec, dim_of, (2, 3)) if spec else None
        else:  # nested: a row Slice (axis 2), then a column Slice (axis 3)
            inner = p.producer()
            row = inner.inputs[0].producer()
            rs, cs = _slice_spec(row, 4), _slice_spec(inner, 4)
            ro = _offset(rs, dim_of, (2,)) if rs else None
            co = _offset(cs, dim_of, (3,)) if cs else None
            off = None if ro is None or co is None else (ro[0], co[0])
        if off is None:
            return "a slice does not keep every second row and column to the end"
        order.append(off)
    if sorted(order) != sorted(S2D_ORDER):
        return f"the four parts take offsets {order}, not each of the four 2x2 offsets once"
    return order


def check_focus(ctx, x, cat, p0, p1, p2, p3, r0=None, r1=None):
    got = focus_order(x, cat, p0, p1, p2, p3, r0, r1)
    return fail(f"Focus: {got}") if isinstance(got, str) else True


def space_to_depth(op, x, cat, p0, p1, p2, p3, r0=None, r1=None, **_):
    import numpy as np

    order = focus_order(x, cat, p0, p1, p2, p3, r0, r1)
    s2d = op.SpaceToDepth(x, blocksize=2)
    if list(order) == list(S2D_ORDER):
        return s2d
    c = dims(x)[1]
    if c is None:
        return None  # the permutation needs the channel count: the function form Focus
    # concat part i holds the block SpaceToDepth puts at group dy * 2 + dx
    index = np.concatenate([np.arange(c) + (dy * 2 + dx) * c for dy, dx in order])
    return op.Gather(s2d, new_initializer(op, index.astype(np.int64), "focus_perm"), axis=1)


register(Rule("Focus", (focus_merged, _nested((0, 1, 0, 1)), _nested((0, 0, 1, 1))),
              check_focus, standard=space_to_depth, opset=1, standard_op="SpaceToDepth",
              inputs=("x",), priority=60,
              doc="YOLOv5 Focus: four strided slices + Concat -> SpaceToDepth (+ a channel "
                  "Gather when the concat order is not SpaceToDepth's)"))
