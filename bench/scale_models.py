"""The models ``bench/scale.py`` grows: a Qwen2-shaped decoder (Qwen2-0.5B's widths: hidden
896, intermediate 4864, 14 heads / 2 KV heads, vocabulary 151,936, tied embeddings) at any
depth, and a wide CNN for contrast. Seeded random weights (nothing downloaded); the 24-layer
decoder is Qwen2-0.5B's shape, 494M parameters, 1.98 GB in fp32.

Both return ``(model in eval mode, example inputs)`` like ``workbench.zoo``'s factories.
The decoder returns the logits (``Qwen2ForCausalLM``, no cache) with the eager attention:
its causal mask is float (with "sdpa" pnnx stores a byte mask ncnn's SDPA crashes on,
bench/hf_models.py). ``small=True`` gives the same graph at test widths.
"""

from __future__ import annotations

from typing import Any

SEED = 0
QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=512,
                 tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1_000_000.0)
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128,
             tie_word_embeddings=True)


def decoder(layers: int, tokens: int = 64, small: bool = False) -> tuple[Any, tuple]:
    """A Qwen2-shaped causal LM of ``layers`` layers and ``tokens`` input ids (logits out)."""
    import torch
    import transformers as T  # noqa: N812

    from workbench.zoo import _wrap

    torch.manual_seed(SEED)
    config = T.Qwen2Config(num_hidden_layers=layers, use_cache=False,
                           **(SMALL if small else QWEN2_05B))
    config._attn_implementation = "eager"
    model = _wrap(T.Qwen2ForCausalLM(config), "logits")
    ids = torch.randint(0, config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(SEED))
    return model, (ids,)


def wide_cnn(width: int = 512, blocks: int = 8, size: int = 64) -> tuple[Any, tuple]:
    """A plain CNN of ``blocks`` 3x3 conv + BN + ReLU at ``width`` channels (~19M parameters
    at the defaults): many large weights and activations, no attention, for contrast."""
    import torch
    from torch import nn

    from workbench.zoo import _calibrate_batchnorm

    torch.manual_seed(SEED)
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 1000)]
    model = _calibrate_batchnorm(nn.Sequential(*layers).eval(), 2, 3, size, size)
    x = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(SEED))
    return model.eval(), (x,)
