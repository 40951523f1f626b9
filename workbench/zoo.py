"""A zoo of real architectures from ``transformers``, small and seeded (nothing downloaded).

Each factory builds a model from a ``transformers`` config class with a small config and
seeded random weights, wrapped so ``forward`` returns plain tensors (what pnnx, the ONNX
exporters and the runners take), and returns it in eval mode with seeded example inputs.
torch and transformers are imported inside the factories: importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    from torch import Tensor, nn

    Factory = Callable[[], tuple[nn.Module, tuple[Tensor, ...]]]
else:
    Factory = Callable[[], tuple[Any, tuple]]

SEED = 0
# Weight std for the attention models: at transformers' default 0.02 and these small widths the
# attention scores are ~0 and softmax is uniform, so a check would not see the attention at all.
ATTENTION_INIT = 0.2


def _prepare(seed: int) -> None:
    """Seed the random weights about to be built (from local configs: no Hub access)."""
    import torch

    torch.manual_seed(seed)


def _wrap(model: Any, *fields: str) -> Any:
    """``model`` in eval mode behind a forward that returns ``fields`` of its ModelOutput."""
    from torch import nn

    class Outputs(nn.Module):
        """Unwraps a ModelOutput into one tensor, or a tuple of tensors, by field name."""

        def __init__(self, inner: nn.Module, names: tuple[str, ...]) -> None:
            super().__init__()
            self.model = inner
            self.names = names

        def forward(self, *args: Any) -> Any:
            out = self.model(*args, return_dict=True)
            got = tuple(getattr(out, n) for n in self.names)
            return got[0] if len(got) == 1 else got

    Outputs.__name__ = Outputs.__qualname__ = type(model).__name__ + "Outputs"
    return Outputs(model, fields).eval()


def _calibrate_batchnorm(model: Any, *shape: int, seed: int = SEED) -> Any:
    """Give every BatchNorm seeded random affine parameters and the running statistics of a
    seeded random batch of ``shape``, so eval-mode activations keep a sane scale.

    A freshly initialised BN holds running mean 0 and variance 1, so in eval mode it passes
    its input through unscaled: through a deep stack of small random convs the signal
    vanishes (MobileNetV2 logits ~1e-25) and a numeric check on it proves nothing.
    """
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    model.eval()
    with torch.no_grad():
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average: one batch sets the statistics exactly
            if bn.affine:
                bn.weight.copy_(torch.rand(bn.weight.shape, generator=gen) + 0.5)
                bn.bias.copy_(torch.randn(bn.bias.shape, generator=gen) * 0.1)
            bn.train()
        model(torch.rand(*shape, generator=gen))
        for bn in norms:
            bn.momentum = 0.1
            bn.eval()
    return model


def _image(*shape: int, seed: int = SEED) -> tuple[Any, ...]:
    import torch

    return (torch.rand(*shape, generator=torch.Generator().manual_seed(seed)),)


def resnet() -> tuple[Any, tuple]:
    """ResNet (basic blocks, one per stage, widths 16-128), 10-class logits, 1x3x64x64."""
    from transformers import ResNetConfig, ResNetForImageClassification

    _prepare(SEED)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                       layer_type="basic", num_labels=10)
    model = _calibrate_batchnorm(_wrap(ResNetForImageClassification(cfg), "logits"), 8, 3, 64, 64)
    return model, _image(1, 3, 64, 64)


def mobilenet_v2() -> tuple[Any, tuple]:
    """MobileNetV2 at depth multiplier 0.35 (inverted residuals, ReLU6), 10-class logits,
    1x3x64x64."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    _prepare(SEED)
    cfg = MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    model = _calibrate_batchnorm(_wrap(MobileNetV2ForImageClassification(cfg), "logits"),
                                 8, 3, 64, 64)
    return model, _image(1, 3, 64, 64)


def convnext() -> tuple[Any, tuple]:
    """ConvNeXt (7x7 depthwise conv, channels-first LayerNorm, GELU, layer scale; one block
    per stage, widths 16-128), 10-class logits, 1x3x64x64."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    _prepare(SEED)
    # layer scale at its default 1e-6 would make every block an identity to the check
    cfg = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=64,
                         layer_scale_init_value=1.0, num_labels=10)
    return _wrap(ConvNextForImageClassification(cfg), "logits"), _image(1, 3, 64, 64)


def vit() -> tuple[Any, tuple]:
    """ViT (patch 8 on 32x32 = 16 patches + CLS, hidden 32, 2 layers, 4 heads), 10-class
    logits from the CLS token, 1x3x32x32."""
    from transformers import ViTConfig, ViTForImageClassification

    _prepare(SEED)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, num_labels=10,
                    initializer_range=ATTENTION_INIT)
    return _wrap(ViTForImageClassification(cfg), "logits"), _image(1, 3, 32, 32)


def swin() -> tuple[Any, tuple]:
    """Swin (patch 4 on 32x32, window 4, embed 16; stage 1: two blocks, the second with
    shifted windows; patch merging; stage 2: one block; heads 2 and 4; relative position
    bias), 10-class logits, 1x3x32x32."""
    from transformers import SwinConfig, SwinForImageClassification

    _prepare(SEED)
    cfg = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 4],
                     window_size=4, mlp_ratio=2.0, num_labels=10, initializer_range=ATTENTION_INIT)
    return _wrap(SwinForImageClassification(cfg), "logits"), _image(1, 3, 32, 32)


def bert() -> tuple[Any, tuple]:
    """BERT encoder (vocab 100, hidden 32, 2 layers, 4 heads), token ids 1x16 int64 in; the
    last hidden state (1x16x32) and the pooled CLS output (1x32) out."""
    import torch
    from transformers import BertConfig, BertModel

    _prepare(SEED)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32,
                     initializer_range=ATTENTION_INIT)
    model = _wrap(BertModel(cfg), "last_hidden_state", "pooler_output")
    ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(SEED),
                        dtype=torch.int64)
    return model, (ids,)


def resnet50() -> tuple[Any, tuple]:
    """The full ResNet-50 of ``ResNetConfig()`` (bottleneck blocks 3-4-6-3, 1000-class logits),
    seeded random weights, 1x3x224x224: a realistic size for benchmarks, not for quick tests."""
    from transformers import ResNetConfig, ResNetForImageClassification

    _prepare(SEED)
    # ResNetConfig() is ResNet-50 but for its head: num_labels defaults to 2, not ImageNet's 1000
    cfg = ResNetConfig(num_labels=1000)
    model = _calibrate_batchnorm(_wrap(ResNetForImageClassification(cfg), "logits"), 2, 3, 224, 224)
    return model, _image(1, 3, 224, 224)


ZOO: dict[str, Factory] = {
    "resnet": resnet,
    "mobilenet_v2": mobilenet_v2,
    "convnext": convnext,
    "vit": vit,
    "swin": swin,
    "bert": bert,
}
"""The small models, quick to convert; ``resnet50`` is kept apart (see ``get``)."""

_ALL: dict[str, Factory] = {**ZOO, "resnet50": resnet50}


def get(name: str) -> tuple[Any, tuple]:
    """Build the zoo model ``name`` (any key of ``ZOO``, or ``resnet50``): (model, inputs)."""
    factory = _ALL.get(name)
    if factory is None:
        raise InputError(f"no zoo model named {name!r}; known: {', '.join(_ALL)}",
                         "from workbench import zoo; zoo.get('resnet'), or list zoo.ZOO")
    return factory()
