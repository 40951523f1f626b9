"""Architectures the zoo lacks, for ``bench/faults.py``: small, seeded, nothing downloaded.

Each factory returns ``(model in eval mode, example inputs)`` like ``workbench.zoo``'s:

- ``seq_rnn``: a sequence model, Linear -> LSTM -> GRU -> Linear over 16 steps (batch first).
- ``unet``: a two-level UNet, Conv+BN+ReLU encoders, max pooling, ConvTranspose upsampling
  and skip concatenation, a 1x1 head.
- ``yolo_backbone``: a YOLOv5-style backbone: Focus (space-to-depth, as pixel_unshuffle, and
  a conv), Conv+BN+SiLU blocks, a C3 block with residual bottlenecks, SPPF (three chained 5x5
  max pools, concatenated).
- ``mobile_se``: a depthwise-separable net: depthwise 3x3 + pointwise 1x1 convs with BN and
  ReLU6, squeeze-excite (global pool, two 1x1 convs, hardsigmoid gate), inverted residuals,
  a Linear classifier.
- ``causal_decoder``: a GPT-style decoder: token and position embeddings, two pre-norm
  blocks of causal self-attention (separate q/k/v Linears, an additive causal mask) and a
  GELU MLP, a final LayerNorm and a language-model head.

BatchNorm layers get seeded affine parameters and the running statistics of a seeded batch
(``workbench.zoo._calibrate_batchnorm``), so eval-mode activations keep their scale.
torch is imported inside the factories: importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SEED = 0


def _image(*shape: int) -> tuple[Any, ...]:
    import torch

    return (torch.rand(*shape, generator=torch.Generator().manual_seed(SEED)),)


def _conv_bn(cin: int, cout: int, k: int = 3, s: int = 1, act: str = "relu",
             groups: int = 1) -> Any:
    from torch import nn

    acts = {"relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "none": nn.Identity}
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), acts[act]())


def seq_rnn() -> tuple[Any, tuple]:
    """Linear(8->32) -> LSTM(32) -> GRU(32) -> Linear(32->10), 1x16x8 in, 1x16x10 out."""
    import torch
    from torch import nn

    class SeqRNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 32)
            self.lstm = nn.LSTM(32, 32, batch_first=True)
            self.gru = nn.GRU(32, 32, batch_first=True)
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.tanh(self.proj(x))
            x, _ = self.lstm(x)
            x, _ = self.gru(x)
            return self.head(x)

    torch.manual_seed(SEED)
    return SeqRNN().eval(), _image(1, 16, 8)


def unet() -> tuple[Any, tuple]:
    """A two-level UNet (widths 8-16-32), ConvTranspose up, skip concat, 1x3x32x32 in."""
    import torch
    from torch import nn

    from workbench.zoo import _calibrate_batchnorm

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc1 = _conv_bn(3, 8)
            self.enc2 = _conv_bn(8, 16)
            self.pool = nn.MaxPool2d(2)
            self.mid = _conv_bn(16, 32)
            self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.dec2 = _conv_bn(32, 16)
            self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2)
            self.dec1 = _conv_bn(16, 8)
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e1 = self.enc1(x)
            e2 = self.enc2(self.pool(e1))
            m = self.mid(self.pool(e2))
            d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
            d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
            return self.head(d1)

    torch.manual_seed(SEED)
    return _calibrate_batchnorm(UNet(), 4, 3, 32, 32), _image(1, 3, 32, 32)


def yolo_backbone() -> tuple[Any, tuple]:
    """Focus, Conv+BN+SiLU, a C3 block (two residual bottlenecks), SPPF; 1x3x64x64 in."""
    import torch
    from torch import nn

    from workbench.zoo import _calibrate_batchnorm

    class Focus(nn.Module):
        """YOLOv5's Focus: the four pixel phases stacked on channels, then a conv. Written as
        ``F.pixel_unshuffle`` (space-to-depth; ncnn runs it as Reorg): YOLOv5's strided
        slices ``x[..., ::2, ::2]``... do not convert to ncnn (pnnx leaves Tensor.slice with
        step 2). The channel order differs from the slicing form by a fixed permutation,
        which the conv after it absorbs."""

        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = _conv_bn(cin * 4, cout, 3, act="silu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(nn.functional.pixel_unshuffle(x, 2))

    class Bottleneck(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.cv1 = _conv_bn(c, c, 1, act="silu")
            self.cv2 = _conv_bn(c, c, 3, act="silu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.cv2(self.cv1(x))

    class C3(nn.Module):
        def __init__(self, cin: int, cout: int, n: int) -> None:
            super().__init__()
            h = cout // 2
            self.cv1 = _conv_bn(cin, h, 1, act="silu")
            self.cv2 = _conv_bn(cin, h, 1, act="silu")
            self.m = nn.Sequential(*(Bottleneck(h) for _ in range(n)))
            self.cv3 = _conv_bn(2 * h, cout, 1, act="silu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.cv3(torch.cat([self.m(self.cv1(x)), self.cv2(x)], 1))

    class SPPF(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            h = cin // 2
            self.cv1 = _conv_bn(cin, h, 1, act="silu")
            self.pool = nn.MaxPool2d(5, 1, 2)
            self.cv2 = _conv_bn(4 * h, cout, 1, act="silu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.cv1(x)
            y1 = self.pool(x)
            y2 = self.pool(y1)
            return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))

    class Backbone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.focus = Focus(3, 16)
            self.down1 = _conv_bn(16, 32, 3, 2, act="silu")
            self.c3 = C3(32, 32, 2)
            self.down2 = _conv_bn(32, 64, 3, 2, act="silu")
            self.sppf = SPPF(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.sppf(self.down2(self.c3(self.down1(self.focus(x)))))

    torch.manual_seed(SEED)
    return _calibrate_batchnorm(Backbone(), 4, 3, 64, 64), _image(1, 3, 64, 64)


def mobile_se() -> tuple[Any, tuple]:
    """Stem, three depthwise-separable inverted-residual blocks with squeeze-excite, a
    Linear classifier (10 classes); 1x3x32x32 in."""
    import torch
    from torch import nn

    from workbench.zoo import _calibrate_batchnorm

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int, r: int = 4) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(c, c // r, 1)
            self.act = nn.ReLU()
            self.fc2 = nn.Conv2d(c // r, c, 1)
            self.gate = nn.Hardsigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int = 2) -> None:
            super().__init__()
            mid = cin * expand
            self.expand = _conv_bn(cin, mid, 1, act="relu6")
            self.dw = _conv_bn(mid, mid, 3, stride, act="relu6", groups=mid)
            self.se = SqueezeExcite(mid)
            self.project = _conv_bn(mid, cout, 1, act="none")
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.project(self.se(self.dw(self.expand(x))))
            return x + y if self.residual else y

    class MobileSE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = _conv_bn(3, 16, 3, 2, act="relu6")
            self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 24, 2), Block(24, 24, 1))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Linear(24, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))

    torch.manual_seed(SEED)
    return _calibrate_batchnorm(MobileSE(), 4, 3, 32, 32), _image(1, 3, 32, 32)


def causal_decoder() -> tuple[Any, tuple]:
    """GPT-style: vocab 64, 16 positions, width 32, 2 blocks of 4 heads; token ids 1x16 in,
    logits 1x16x64 out."""
    import math

    import torch
    from torch import nn

    width, heads, length, vocab = 32, 4, 16, 64

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(width, width)
            self.k_proj = nn.Linear(width, width)
            self.v_proj = nn.Linear(width, width)
            self.out_proj = nn.Linear(width, width)
            mask = torch.full((length, length), -1e4).triu(1)
            self.register_buffer("mask", mask.view(1, 1, length, length))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            d = c // heads

            def split(y: torch.Tensor) -> torch.Tensor:
                return y.view(b, t, heads, d).transpose(1, 2)

            q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d) + self.mask, dim=-1)
            return self.out_proj((att @ v).transpose(1, 2).reshape(b, t, c))

    class DecoderBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = CausalSelfAttention()
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.act = nn.GELU()
            self.proj = nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.proj(self.act(self.fc(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.randn(1, length, width) * 0.1)
            self.blocks = nn.Sequential(DecoderBlock(), DecoderBlock())
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocab, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.ln_f(self.blocks(self.tok(ids) + self.pos)))

    torch.manual_seed(SEED)
    model = Decoder()
    with torch.no_grad():  # attention init wide enough that softmax is not uniform
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(0.0, 0.3)
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(SEED))
    return model.eval(), (ids,)


MODELS: dict[str, Callable[[], tuple[Any, tuple]]] = {
    "seq_rnn": seq_rnn,
    "unet": unet,
    "yolo_backbone": yolo_backbone,
    "mobile_se": mobile_se,
    "causal_decoder": causal_decoder,
}
