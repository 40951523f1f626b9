"""Small models that fall into the tracing traps the export stage must catch.

Each trap sits on its own line so a test can check the diagnostic names it.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


class ItemScale(nn.Module):
    def forward(self, x):
        s = x.mean().item()  # TRAP: item
        return x * s


class ToListPad(nn.Module):
    def forward(self, x):
        sizes = torch.tensor(x.shape).tolist()  # TRAP: tolist
        return x + sizes[1]


class FrozenBatch(nn.Module):
    """view(int(x.size(0)), -1) freezes the batch into the Reshape; the Gemm then breaks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3 * 4 * 4, 4)

    def forward(self, x):
        n = int(x.size(0))  # TRAP: int-size
        return self.fc(x.view(n, -1))


class SliceFrozen(nn.Module):
    """ORT runs at another batch size but returns the traced batch (output shape differs)."""

    def forward(self, x):
        n = int(x.size(0))  # TRAP: slice
        return x[:n] * 2


class FactorInput(nn.Module):
    """An upscale factor given as a tensor but read as a Python number: the input is dropped."""

    def forward(self, x, factor):
        s = float(factor)  # TRAP: float-input
        return nn.functional.interpolate(x, scale_factor=s, mode="nearest")


class RowLoop(nn.Module):
    def forward(self, x):
        acc = torch.zeros_like(x[0])
        for row in x:  # TRAP: loop
            acc = acc + row
        return acc


class Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # TRAP: branch
            return x * 2
        return x - 1


class Asinh(nn.Module):
    def forward(self, x):
        return torch.asinh(x)


class GridSample(nn.Module):
    def forward(self, x, grid):
        return nn.functional.grid_sample(x, grid, align_corners=False)


class Warns(nn.Module):
    def forward(self, x):
        warnings.warn("deprecated knob in use", UserWarning, stacklevel=1)
        return x + 1


class Glue(nn.Module):
    """Shape arithmetic that the TorchScript exporter lowers to Shape/Gather/Concat glue."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        y = y.reshape(y.shape[0], y.shape[1], -1).transpose(1, 2)
        return y.reshape(y.shape[0], -1, 8).mean(dim=1) + torch.ones(1) * 0


class TwoInputs(nn.Module):
    def forward(self, a, b):
        return a * 2 + b


def trap_line(marker: str) -> int:
    """Line number of the ``# TRAP: marker`` comment in this file."""
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if f"# TRAP: {marker}" in line:
                return i
    raise KeyError(marker)


@torch.library.custom_op("wbtest::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _twice_fake(x):
    return torch.empty_like(x)


class CustomOp(nn.Module):
    """A torch.library op in a custom namespace that no exporter knows."""

    def forward(self, x):
        return twice(x) + 1


class Focus(nn.Module):
    """YOLOv5's Focus: four strided slices + concat + conv (ncnn has no 2-D strided slice)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(12, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2],
                                    x[..., 1::2, 1::2]], 1))


class FocusNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.focus = Focus()
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.focus(x))


class UnusedCall(nn.Module):
    """Calls a submodule and drops its result (as a ResNetModel wrapper dropping pooler_output)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        y = self.conv(x)
        self.pool(y)
        return y
