"""The ARM target's overflow probe, shared by its tests: one InnerProduct over 64 inputs of
250 with weights +-250, whose exact result is the bias, 1, while fp16 partial sums pass 65504
(ncnn's 8 fp16 lanes: +inf and -inf, NaN on ARMv8.2 with fp16 arithmetic). Fed a 1-D input:
over a (1, 64) blob ncnn's InnerProduct summed in fp32 on ARM too (measured)."""

from __future__ import annotations

import torch
from torch import nn


class Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 1)
        with torch.no_grad():
            w = torch.full((1, 64), 250.0)
            w[0, 1::2] = -250.0
            self.fc.weight.copy_(w)
            self.fc.bias.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def probe_input() -> torch.Tensor:
    return torch.full((64,), 250.0)
