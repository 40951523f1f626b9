"""Pools whose kernel reaches past their map: rewritten as ncnn's global pooling, or named.

torch pools every window that starts inside the (padded) map, so ``AvgPool2d(k,
ceil_mode=True)`` with ``k`` larger than its H x W map averages the whole map into 1 x 1
(transformers' EfficientNet pooler, ``AvgPool2d(1280, ceil_mode=True)``). pnnx writes such a
pool as an ncnn Pooling with that kernel, which ncnn computes otherwise: garbage, its input
unpooled, or -100.

The rule, as a graph pattern: a 2-D average or max pool of pnnx's graph (``nn.AvgPool2d``,
``F.max_pool2d``...) whose input map has a static size there, whose torch result is the
global pool of that map (one output per axis, its one window covering the map; no dilation;
an average divided by H x W: no padding counted, no divisor_override), and whose kernel is
larger than the padded map on an axis (a kernel that fits, ncnn pools right). The ncnn
Pooling it became (paired in order: the same type, kernel and stride) is written as ncnn's
global pooling (4=1) when what reads it takes a vector (Flatten, InnerProduct, Reshape, as
after pnnx's own global pools), else as adaptive pooling to 1 x 1 (7=1 8=1 18=1), which keeps
the map's rank: the same numbers either way, and an info diagnostic says which layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import WorkbenchError
from ..params import NcnnLayer, NcnnParam, parse_ncnn_param, parse_pnnx_param

_VECTOR_READERS = frozenset({"Flatten", "InnerProduct", "Reshape"})


@dataclass(frozen=True)
class TorchPool:
    """A 2-D pool of pnnx's graph, in torch's terms, with its input map's (H, W)."""

    kind: int  # ncnn's pooling_type: 0 max, 1 average
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    ceil_mode: bool
    whole_map_divisor: bool  # an average divides by the map's size (max: True)
    dilation: tuple[int, int]
    size: tuple[Any, Any]  # the input map (H, W) as pnnx's shape note gives it

    def is_global(self) -> bool:
        """torch's result is the whole map pooled into 1 x 1."""
        if self.dilation != (1, 1) or not self.whole_map_divisor or not all(
                isinstance(n, int) for n in self.size):
            return False
        return all(_one_window(n, k, s, p, self.ceil_mode) for n, k, s, p in
                   zip(self.size, self.kernel, self.stride, self.padding, strict=True))

    def reaches_past(self) -> bool:
        """The kernel is larger than the padded map on an axis (where ncnn pools otherwise)."""
        return any(k > n + 2 * p for n, k, p in zip(self.size, self.kernel, self.padding,
                                                     strict=True))


def _one_window(n: int, k: int, s: int, p: int, ceil: bool) -> bool:
    """torch's pool on an axis of size ``n`` has one window, and it covers the axis."""
    span = n + 2 * p - k
    if span < 0 and not ceil:
        return False  # torch refuses the size
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1  # torch drops a last window that starts in the right padding
    return out == 1 and k - p >= n


def global_pools(ncnn_param: Path, pnnx_param: Path) -> Diagnostic | None:
    """Rewrite (in place) each Pooling of ``ncnn_param`` that the rule above matches; the info
    diagnostic (``ncnn-global-pool``) naming each layer, kernel and map, or None."""
    try:
        graph = parse_ncnn_param(ncnn_param)
        pools = torch_pools(pnnx_param)
    except (WorkbenchError, OSError):
        return None
    layers = [la for la in graph.layers if la.type == "Pooling"
              and str(la.params.get(4, "0")) == "0" and str(la.params.get(7, "0")) == "0"]
    if len(layers) != len(pools) or not all(_same(la, tp) for la, tp in zip(
            layers, pools, strict=True)):
        return None  # no one-to-one pairing: nothing is rewritten on a guess
    lines = ncnn_param.read_text().splitlines()
    done = []
    for la, tp in zip(layers, pools, strict=True):
        if not (tp.is_global() and tp.reaches_past()) or lines[la.line - 1].split()[:2] != [
                "Pooling", la.name]:
            continue
        vector = _read_as_vector(graph, la.tops[0])
        lines[la.line - 1] = _rewritten(lines[la.line - 1], la, vector)
        (h, w), (kh, kw) = tp.size, tp.kernel
        done.append(f"{la.name} ({'average' if tp.kind else 'max'}, kernel {kh}x{kw} over a "
                    f"{h}x{w} map{', ceil_mode' if tp.ceil_mode else ''}) as "
                    + ("global pooling (4=1)" if vector else
                       "adaptive pooling to 1x1 (7=1 8=1 18=1), keeping the map's rank"))
    if not done:
        return None
    ncnn_param.write_text("\n".join(lines) + "\n")
    return Diagnostic(
        "info", "ncnn-global-pool",
        f"{len(done)} Pooling layer(s) with a kernel larger than the map, which torch pools "
        "whole (one window) and ncnn's Pooling with that kernel does not, written as ncnn's "
        f"whole-map pooling (the same numbers): {'; '.join(done)}",
        "nothing to do; to keep the model independent of the input size, write "
        "AdaptiveAvgPool2d(1) / AdaptiveMaxPool2d(1) for a pool over the whole map")


def torch_pools(pnnx_param: Path) -> list[TorchPool]:
    """The 2-D average and max pools of pnnx's graph (not adaptive), in graph order."""
    graph = parse_pnnx_param(pnnx_param)
    pools = []
    for op in graph.ops:
        kind = re.sub(r"[^a-z0-9]", "", op.type.lower().rpartition(".")[2])
        if kind in ("avgpool2d", "maxpool2d"):
            shape = graph.operands[op.inputs[0]].shape if op.inputs else None
            pools.append(_torch_pool(op.params, kind == "avgpool2d", shape))
    return pools


def _torch_pool(p: dict[str, str], avg: bool, shape: tuple | None) -> TorchPool:
    """One pool from its pnnx parameters (torch's keys) and its input's shape note."""
    kernel = _pair(p.get("kernel_size"))
    padding = _pair(p.get("padding")) or (0, 0)
    # an average over the whole map divides by H x W: padding counted in would add to it
    whole = not avg or (p.get("divisor_override", "None") == "None" and (
        padding == (0, 0) or p.get("count_include_pad") == "False"))
    return TorchPool(
        kind=1 if avg else 0, kernel=kernel, stride=_pair(p.get("stride")) or kernel,
        padding=padding, ceil_mode=p.get("ceil_mode") == "True", whole_map_divisor=whole,
        dilation=_pair(p.get("dilation")) or (1, 1),
        size=tuple(shape[-2:]) if shape and len(shape) >= 3 else (None, None))


def _pair(text: str | None) -> tuple[int, ...]:
    """``(8,8)`` or ``8`` as (h, w); () when absent or not one or two numbers."""
    nums = re.findall(r"-?\d+", text or "")
    return (int(nums[0]), int(nums[-1])) if 1 <= len(nums) <= 2 else ()


def _same(la: NcnnLayer, tp: TorchPool) -> bool:
    """The ncnn Pooling ``la`` is pnnx's conversion of ``tp``: type, kernel and stride."""
    def num(key: int, default: Any) -> int:
        return int(float(str(la.params.get(key, default))))

    kw = num(1, 0)
    sw = num(2, 1)
    return (num(0, 0) == tp.kind and (num(11, kw), kw) == tp.kernel
            and (num(12, sw), sw) == tp.stride)


def _read_as_vector(graph: NcnnParam, blob: str) -> bool:
    """Every layer reading ``blob`` (through Splits) takes ncnn's 1-D global-pool output as
    it takes a C x 1 x 1 map."""
    for name in graph.consumers.get(blob, []):
        reader = graph.layer(name)
        if reader.type == "Split":
            if not all(_read_as_vector(graph, t) for t in reader.tops):
                return False
        elif reader.type not in _VECTOR_READERS:
            return False
    return bool(graph.consumers.get(blob))


def _rewritten(line: str, la: NcnnLayer, vector: bool) -> str:
    """The Pooling line with its kernel, stride and padding replaced by a whole-map pool."""
    n = 4 + len(la.bottoms) + len(la.tops)  # type, name, counts, blobs: kept as written
    head = re.match(rf"\s*(?:\S+\s+){{{n}}}", line + " ")
    kind = str(la.params.get(0, "0"))
    return (head.group(0) if head else line) + " ".join(
        [f"0={kind}"] + (["4=1"] if vector else ["7=1", "8=1", "18=1"]))


def wide_pools(blobs: dict[str, Any], graph: Any) -> str:
    """The hint when a Pooling's kernel is larger than its input and the layer was not
    rewritten (a dynamic map, a pool torch does not take whole): torch pools what there is,
    ncnn returns another shape. '' when no such layer (or the run failed)."""
    if graph is None:
        return ""
    wide = []
    for la in graph.layers:
        if la.type != "Pooling" or str(la.params.get(4, "0")) != "0" or la.bottoms[0] \
                not in blobs:
            continue
        kw = int(float(str(la.params.get(1, "0"))))
        kh = int(float(str(la.params.get(11, kw))))
        shape = blobs[la.bottoms[0]].shape
        if len(shape) < 2:
            continue
        h, w = shape[-2:]
        if kh > h or kw > w:
            top = blobs.get(la.tops[0])
            got = ("its input unpooled" if top is not None and top.shape == shape
                   else f"shape {list(top.shape)}" if top is not None else "no blob")
            wide.append(f"{la.name} (kernel {kh}x{kw} over a {h}x{w} input) returns {got}")
    if not wide:
        return ""
    return (f"ncnn's Pooling {'; '.join(wide)}: ncnn does not pool as torch does when the "
            "kernel is larger than the map (torch, with ceil_mode, pools what there is). Give "
            "the pool a kernel no larger than the map at this input size, or use "
            "AdaptiveAvgPool2d(1) / AdaptiveMaxPool2d(1) for a pool over the whole map, and "
            "convert again")
