"""transformers architectures beyond the zoo, for ``bench/faults.py --models hf``: small
configs, seeded, nothing downloaded. An opt-in set, not in the default run: it is where new
wrong verdicts are looked for, and what it finds is listed in the run's misses.

Each factory returns ``(model in eval mode, example inputs)`` like ``workbench.zoo``'s
(``zoo._wrap`` returns one output field). Attention models use weights of std 0.2
(``zoo.ATTENTION_INIT``): at transformers' 0.02 and these widths softmax is uniform.
BatchNorm layers get seeded statistics (``zoo._calibrate_batchnorm``). torch and transformers
are imported inside the factories.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

INIT = 0.2  # workbench.zoo.ATTENTION_INIT


def _tokens(n: int = 12, vocab: int = 100) -> tuple[Any, ...]:
    import torch

    return (torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(1)),)


def _image(size: int = 64) -> tuple[Any, ...]:
    import torch

    return (torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def _bn(model: Any, x: tuple) -> tuple[Any, tuple]:
    from workbench.zoo import _calibrate_batchnorm

    return _calibrate_batchnorm(model, 4, *x[0].shape[1:]), x


def _eager(config: Any) -> Any:
    """``config`` with the eager attention: its causal mask is float. With the default
    "sdpa" attention pnnx stores the boolean mask as bytes and ncnn's SDPA crashes on it
    (runtime/ncnn_masks.py; GPT-NeoX, left at the default, shows the garbage it computes
    when it does not crash)."""
    config._attn_implementation = "eager"
    return config


def _build(name: str) -> tuple[Any, tuple]:
    import torch
    import transformers as T  # noqa: N812

    from workbench.zoo import _wrap

    torch.manual_seed(0)
    last, pooled = "last_hidden_state", "pooler_output"
    text = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, vocab_size=100, max_position_embeddings=32,
                initializer_range=INIT)
    vision = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, initializer_range=INIT)
    decoder = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                   max_position_embeddings=64, initializer_range=INIT, use_cache=False)
    if name == "llama":
        return _wrap(T.LlamaModel(_eager(T.LlamaConfig(**decoder))), last), _tokens()
    if name == "qwen2":
        return _wrap(T.Qwen2Model(_eager(T.Qwen2Config(**decoder))), last), _tokens()
    if name == "t5_encoder":
        return _wrap(T.T5EncoderModel(T.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=100)),
            last), _tokens()
    if name == "whisper_encoder":
        model = T.WhisperModel(T.WhisperConfig(
            d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
            num_mel_bins=16, max_source_positions=32, init_std=INIT)).get_encoder()
        return _wrap(model, last), (torch.randn(1, 16, 64,
                                                generator=torch.Generator().manual_seed(1)),)
    if name == "albert":
        return _wrap(T.AlbertModel(T.AlbertConfig(embedding_size=32, **text),
                                   add_pooling_layer=False), last), _tokens()
    if name == "squeezebert":
        groups = dict(q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                      intermediate_groups=2, output_groups=2)
        return _wrap(T.SqueezeBertModel(T.SqueezeBertConfig(embedding_size=64, **text,
                                                            **groups)), last), _tokens()
    if name == "efficientnet":
        return _bn(_wrap(T.EfficientNetModel(T.EfficientNetConfig(
            image_size=64, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320)),
            pooled), _image())
    if name == "levit":
        return _bn(_wrap(T.LevitModel(T.LevitConfig(
            image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2],
            depths=[1, 1, 1], key_dim=[8, 8, 8])), pooled), _image())
    if name == "beit":
        return _wrap(T.BeitModel(T.BeitConfig(intermediate_size=128,
                                              use_relative_position_bias=True, **vision),
                                 add_pooling_layer=False), last), _image(32)
    if name == "dinov2":
        return _wrap(T.Dinov2Model(T.Dinov2Config(mlp_ratio=2, **vision)), last), _image(32)
    if name == "clip_vision":
        return _wrap(T.CLIPVisionModel(T.CLIPVisionConfig(intermediate_size=128, **vision)),
                     last), _image(32)
    if name == "focalnet":
        return _wrap(T.FocalNetModel(T.FocalNetConfig(
            image_size=64, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32],
            initializer_range=INIT)), pooled), _image()
    if name == "segformer":
        return _wrap(T.SegformerModel(T.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
            num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
            mlp_ratios=[2, 2], initializer_range=INIT)), last), _image()
    if name == "regnet":
        return _bn(_wrap(T.RegNetModel(T.RegNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8)),
            pooled), _image())
    if name == "wav2vec2":
        model = T.Wav2Vec2Model(T.Wav2Vec2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            initializer_range=INIT, do_stable_layer_norm=True, feat_extract_norm="layer"))
        return _wrap(model, last), (torch.randn(1, 1600,
                                                generator=torch.Generator().manual_seed(1)),)
    if name == "poolformer":
        return _wrap(T.PoolFormerModel(T.PoolFormerConfig(
            hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3],
            strides=[4, 2], padding=[2, 1], initializer_range=INIT)), last), _image()
    if name == "mobilevit":
        return _bn(_wrap(T.MobileViTModel(T.MobileViTConfig(
            image_size=64, hidden_sizes=[32, 48, 64],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2)), pooled),
            _image())
    if name == "gpt2":  # transformers' Conv1D (weight [in, out], addmm), not nn.Linear
        return _wrap(T.GPT2Model(_eager(T.GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=100, n_positions=32,
            initializer_range=INIT, use_cache=False))), last), _tokens()
    if name == "bloom":  # ALiBi position bias
        return _wrap(T.BloomModel(T.BloomConfig(
            hidden_size=64, n_layer=2, n_head=4, vocab_size=100, initializer_range=INIT,
            use_cache=False)), last), _tokens()
    if name == "gpt_neox":  # rotary on a part of each head
        return _wrap(T.GPTNeoXModel(T.GPTNeoXConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            vocab_size=100, max_position_embeddings=64, rotary_pct=0.5,
            initializer_range=INIT, use_cache=False)), last), _tokens()
    if name == "distilbert":
        return _wrap(T.DistilBertModel(T.DistilBertConfig(
            dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=100,
            max_position_embeddings=32, initializer_range=INIT)), last), _tokens()
    if name == "bit":  # weight-standardised convolutions: the weight is computed in forward
        return _bn(_wrap(T.BitModel(T.BitConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="preactivation",
            global_padding="SAME", num_groups=8)), pooled), _image())
    if name == "convnextv2":  # global response normalisation
        return _wrap(T.ConvNextV2Model(T.ConvNextV2Config(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], initializer_range=INIT)),
            pooled), _image()
    if name == "mobilenet_v1":  # TensorFlow "SAME" padding: explicit pads before convs
        return _bn(_wrap(T.MobileNetV1Model(T.MobileNetV1Config(
            image_size=64, depth_multiplier=0.25)), pooled), _image())
    if name == "cvt":  # convolutional projections inside attention; 3 stages, and stage k
        # needs depth > k (transformers indexes its drop-path rates by the stage)
        three = dict(patch_sizes=[7, 3, 3], patch_stride=[4, 2, 2], patch_padding=[2, 1, 1],
                     embed_dim=[16, 24, 32], num_heads=[1, 2, 2], depth=[1, 2, 3],
                     mlp_ratio=[2.0] * 3, attention_drop_rate=[0.0] * 3, drop_rate=[0.0] * 3,
                     drop_path_rate=[0.0] * 3, qkv_bias=[True] * 3,
                     cls_token=[False, False, True], qkv_projection_method=["dw_bn"] * 3,
                     kernel_qkv=[3] * 3, padding_kv=[1] * 3, stride_kv=[2] * 3,
                     padding_q=[1] * 3, stride_q=[1] * 3)
        return _bn(_wrap(T.CvtModel(T.CvtConfig(initializer_range=INIT, **three),
                                    add_pooling_layer=False), last), _image())
    if name == "yolos":  # detection tokens appended to the patches
        return _wrap(T.YolosModel(T.YolosConfig(
            intermediate_size=128, num_detection_tokens=4,
            **{**vision, "image_size": [32, 32]}),
            add_pooling_layer=False), last), _image(32)
    if name == "hubert":
        model = T.HubertModel(T.HubertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            initializer_range=INIT))
        return _wrap(model, last), (torch.randn(1, 1600,
                                                generator=torch.Generator().manual_seed(1)),)
    if name == "mistral":  # sliding-window causal attention, grouped KV heads
        return _wrap(T.MistralModel(_eager(T.MistralConfig(sliding_window=8, **decoder))),
                     last), _tokens()
    if name == "phi":  # attention and MLP in parallel off one LayerNorm; partial rotary
        return _wrap(T.PhiModel(_eager(T.PhiConfig(partial_rotary_factor=0.5, **decoder))),
                     last), _tokens()
    if name == "gemma":  # RMSNorm scaled by (1 + weight), GeGLU, scaled embeddings
        return _wrap(T.GemmaModel(_eager(T.GemmaConfig(head_dim=16, **decoder))), last), \
            _tokens()
    if name == "opt":  # learned positions with an offset, pre-LayerNorm
        return _wrap(T.OPTModel(_eager(T.OPTConfig(
            hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
            vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=64,
            init_std=INIT, use_cache=False))), last), _tokens()
    if name == "electra":  # embeddings projected from a smaller size
        return _wrap(T.ElectraModel(T.ElectraConfig(embedding_size=32, **text)), last), \
            _tokens()
    if name == "deberta_v2":  # disentangled attention: relative positions, content x position
        return _wrap(T.DebertaV2Model(T.DebertaV2Config(
            relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
            max_relative_positions=16, **text)), last), _tokens()
    if name == "swinv2":  # cosine attention with a learned scale, log-spaced position MLP
        return _wrap(T.Swinv2Model(T.Swinv2Config(
            image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
            window_size=4, initializer_range=INIT)), pooled), _image(32)
    if name == "deit":  # a distillation token beside the class token
        return _wrap(T.DeiTModel(T.DeiTConfig(intermediate_size=128, **vision),
                                 add_pooling_layer=False), last), _image(32)
    if name == "wavlm":  # gated relative position bias
        model = T.WavLMModel(T.WavLMConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_buckets=32,
            max_bucket_distance=64, initializer_range=INIT))
        return _wrap(model, last), (torch.randn(1, 1600,
                                                generator=torch.Generator().manual_seed(1)),)
    if name == "mobilenet_v2":  # inverted residuals, ReLU6, TensorFlow padding
        return _bn(_wrap(T.MobileNetV2Model(T.MobileNetV2Config(
            image_size=64, depth_multiplier=0.35)), pooled), _image())
    raise KeyError(name)


NAMES = ("llama", "qwen2", "t5_encoder", "whisper_encoder", "albert", "squeezebert",
         "efficientnet", "levit", "beit", "dinov2", "clip_vision", "focalnet", "segformer",
         "regnet", "wav2vec2", "poolformer", "mobilevit", "gpt2", "bloom", "gpt_neox",
         "distilbert", "bit", "convnextv2", "mobilenet_v1", "cvt", "yolos", "hubert",
         "mistral", "phi", "gemma", "opt", "electra", "deberta_v2", "swinv2", "deit", "wavlm",
         "mobilenet_v2")
MODELS: dict[str, Callable[[], tuple[Any, tuple]]] = {
    f"hf_{n}": (lambda n=n: _build(n)) for n in NAMES}
