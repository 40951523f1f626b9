"""Small models whose exports hold the lowered families the raising rules fold back.

Seeded by the caller (torch.manual_seed); each is tiny so a test exports it in well under a
second.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# YOLOv5's Focus order: (row, col) offsets (0,0), (1,0), (0,1), (1,1) along channels
YOLO_ORDER = ((0, 0), (1, 0), (0, 1), (1, 1))
# SpaceToDepth's (DCR) order: (0,0), (0,1), (1,0), (1,1)
S2D_ORDER = ((0, 0), (0, 1), (1, 0), (1, 1))


class Focus(nn.Module):
    """YOLOv5's Focus: four strided slices of the image concatenated on channels, then a conv."""

    def __init__(self, c1: int = 3, c2: int = 8, order: tuple = YOLO_ORDER) -> None:
        super().__init__()
        self.order = order
        self.conv = nn.Conv2d(c1 * 4, c2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[..., r::2, c::2] for r, c in self.order]
        return self.conv(torch.cat(parts, 1))


class FocusNet(nn.Module):
    """Focus followed by SiLU, as YOLOv5's first layer is."""

    def __init__(self, order: tuple = YOLO_ORDER) -> None:
        super().__init__()
        self.focus = Focus(order=order)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.focus(x))


class Shuffle(nn.Module):
    """Sub-pixel upsampling: conv to C*r^2 channels, PixelShuffle(r)."""

    def __init__(self, r: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3 * r * r, 3, padding=1)
        self.shuffle = nn.PixelShuffle(r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shuffle(self.conv(x))


class Attention(nn.Module):
    """Multi-head self-attention written out by hand (q @ k^T * scale, optional mask, softmax,
    @ v), the way most vision transformers write it."""

    def __init__(self, dim: int = 32, heads: int = 4, scale: float | None = None,
                 softmax_dim: int = -1, mask: bool = False, split_scale: bool = False) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = scale if scale is not None else 1 / math.sqrt(self.head_dim)
        self.softmax_dim, self.split_scale = softmax_dim, split_scale
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mask = nn.Parameter(torch.randn(1, 1, 1, 1), requires_grad=False) if mask else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.split_scale:  # q and k each scaled by scale ** 0.5 (as some exports write it)
            s = math.sqrt(self.scale)
            attn = (q * s) @ (k.transpose(-2, -1) * s)
        else:
            attn = (q @ k.transpose(-2, -1)) * self.scale
        if self.mask is not None:
            attn = attn + torch.triu(torch.full((n, n), -1e4), 1) * self.mask
        attn = attn.softmax(dim=self.softmax_dim)
        out = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)


class Lowered(nn.Module):
    """GroupNorm, GELU (erf) and F.normalize: three families export lowers at low opsets."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.act(self.norm(self.conv(x))), dim=1)


class Linear2d(nn.Module):
    """nn.Linear on a rank-2 input: MatMul + Add at export when the weight is transposed in."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.b = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w + self.b)


def export_once(cache: dict, ws, module: nn.Module, kind: str, shape: tuple, exporter: str,
                opset: int = 17):
    """``wb.export`` of ``module`` on a seeded input, once per (kind, exporter, opset)."""
    import workbench as wb

    key = (kind, exporter, opset)
    if key not in cache:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        cache[key] = wb.export(module.eval(), (x,), workspace=ws, exporter=exporter,
                               opset=opset if exporter == "torchscript" else 18)
    return cache[key]


def load_onnx(art):
    import onnx

    return onnx.load(str(art.path))


def assert_raised(raised, parent, rule: str, op_after: str, max_abs_vs_parent: float = 1e-4):
    """One firing of ``rule``, fewer nodes, ``op_after`` present, the numbers unchanged."""
    import workbench as wb

    rep = wb.RaiseReport.of(raised)
    assert rep.counts == {rule: 1}, str(rep)
    assert raised.graph.node_count < parent.graph.node_count
    assert raised.graph.op_histogram.get(op_after) == 1, raised.graph.op_histogram
    assert raised.ok, [str(d) for d in raised.diagnostics]
    m = raised.metrics
    assert m["rel_vs_parent"] <= 1e-5 and m["max_abs_vs_parent"] <= max_abs_vs_parent
    assert m["max_abs"] is not None and m["max_abs"] < 1e-4  # vs torch, through the lineage
    return rep
