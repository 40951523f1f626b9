"""Example models defined in the project with seeded random weights (nothing downloaded)."""

from __future__ import annotations

from typing import Any


def super_resolution(seed: int = 0, upscale: int = 3) -> Any:
    """The tutorial's super-resolution net: bicubic x3, conv 9x9->64, ReLU, 1x1->32, ReLU, 5x5->3."""
    import torch
    from torch import nn

    class SuperResolutionNet(nn.Module):
        def __init__(self, upscale: int) -> None:
            super().__init__()
            self.upscale = upscale
            self.conv1 = nn.Conv2d(3, 64, kernel_size=9, padding=4)
            self.relu1 = nn.ReLU()
            self.conv2 = nn.Conv2d(64, 32, kernel_size=1, padding=0)
            self.relu2 = nn.ReLU()
            self.conv3 = nn.Conv2d(32, 3, kernel_size=5, padding=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = nn.functional.interpolate(x, scale_factor=self.upscale, mode="bicubic",
                                          align_corners=False)
            x = self.relu1(self.conv1(x))
            x = self.relu2(self.conv2(x))
            return self.conv3(x)

    torch.manual_seed(seed)
    return SuperResolutionNet(upscale).eval()


def default_model(seed: int = 0) -> tuple[Any, tuple]:
    """The embedded default model and its example input (1x3x64x64, seeded).

    Args:
        seed: the seed of the weights and of the input.

    Returns:
        (model in eval mode, (input tensor,)).
    """
    import torch

    model = super_resolution(seed)
    gen = torch.Generator().manual_seed(seed)
    return model, (torch.rand(1, 3, 64, 64, generator=gen),)
