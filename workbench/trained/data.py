"""Real data that installed packages carry, prepared as each trained model was trained.

Images are ``skimage.data``'s bundled photographs (only those the wheel holds: some of
its images download on first use, which fails here); pitch is synthesised (harmonic tones of
known frequency); speech is spoken by Debian's ``espeak-ng`` into memory; sentences are
written here. Nothing is fetched at run time. Every function is seeded and deterministic.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from ..errors import WorkbenchError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# bundled RGB photographs of skimage 0.26 (in its wheel: no download)
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry",
          "hubble_deep_field", "retina", "colorwheel")
SAMPLE_RATE = 16000


def photo(name: str) -> Any:
    """One bundled photograph as HxWx3 uint8."""
    import numpy as np
    from skimage import data

    img = getattr(data, name)()
    return np.ascontiguousarray(img[..., :3])


def imagenet_crops(names: tuple[str, ...], per_image: int, size: int = 224,
                   seed: int = 0) -> list[Any]:
    """``per_image`` square crops of each photograph (side 55-100% of its short side, at
    seeded positions), resized to ``size`` and normalised as ImageNet models are trained
    (RGB in [0, 1], minus mean, over std): a list of 1x3xSxS float32 tensors."""
    import numpy as np
    import torch
    import torch.nn.functional as F  # noqa: N812

    rng = np.random.default_rng(seed)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    out = []
    for name in names:
        img = photo(name)
        h, w = img.shape[:2]
        for _ in range(per_image):
            side = int(min(h, w) * rng.uniform(0.55, 1.0))
            y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = torch.from_numpy(img[y:y + side, x:x + side].copy()).permute(2, 0, 1)
            t = F.interpolate(crop[None].float() / 255, size=(size, size), mode="bilinear",
                              align_corners=False, antialias=True)
            out.append(((t - mean) / std).contiguous())
    return out


def tone_frames(frequencies: Any, seed: int = 0, frame: int = 1024) -> list[Any]:
    """One ``frame``-sample frame at 16 kHz per frequency: a harmonic tone (fundamental and
    three overtones of falling amplitude, seeded phases, a little noise), normalised as
    CREPE's frames are (zero mean, unit deviation): a list of 1xframe float32 tensors."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    t = np.arange(frame) / SAMPLE_RATE
    out = []
    for f0 in frequencies:
        wave = sum(0.6 ** k * np.sin(2 * np.pi * f0 * (k + 1) * t + rng.uniform(0, 2 * np.pi))
                   for k in range(4))
        wave = wave + rng.normal(0, 0.01, frame)
        wave = (wave - wave.mean()) / max(wave.std(), 1e-10)
        out.append(torch.from_numpy(wave.astype(np.float32))[None])
    return out


def speech(text: str, voice: str = "en", speed: int = 150) -> Any:
    """``text`` spoken by espeak-ng, at 16 kHz, float32 in [-1, 1].

    Raises:
        WorkbenchError: espeak-ng is not installed (``make`` installs it) or failed.
    """
    import io
    import wave

    import numpy as np
    from scipy.signal import resample_poly

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise WorkbenchError("the trained zoo's speech samples need espeak-ng, which is not "
                             "installed", "`make system-deps` installs it (Debian's "
                             "espeak-ng); by hand: apt-get install espeak-ng")
    run = subprocess.run([exe, "-v", voice, "-s", str(speed), "--stdout", text],
                         capture_output=True, timeout=60, check=False)
    if run.returncode != 0 or not run.stdout:
        raise WorkbenchError(f"espeak-ng failed on {text!r} (exit {run.returncode}): "
                             f"{run.stderr.decode(errors='replace')[:200]}",
                             f"try it by hand: espeak-ng -v {voice} --stdout 'hello' > x.wav")
    with wave.open(io.BytesIO(run.stdout)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    audio = pcm.astype(np.float32) / 32768
    g = np.gcd(SAMPLE_RATE, rate)
    return resample_poly(audio, SAMPLE_RATE // g, rate // g).astype(np.float32)


SPEECH_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Deploy the model to the phone and check every layer.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Numbers drift a little at every step of the conversion.",
)


def vad_stream(texts: tuple[str, ...], seed: int = 0) -> Any:
    """Speech and silence: each text spoken, with 0.4-0.8 s of quiet noise before and after,
    concatenated (16 kHz float32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    parts = []
    for text in texts:
        n = int(SAMPLE_RATE * rng.uniform(0.4, 0.8))
        parts += [rng.normal(0, 1e-3, n).astype(np.float32), speech(text)]
    parts.append(rng.normal(0, 1e-3, int(SAMPLE_RATE * 0.5)).astype(np.float32))
    return np.concatenate(parts)


# Paraphrase pairs (written for this project): a sentence encoder should put each next to its
# partner; the evaluation asks that a candidate's embedding of each sentence be nearest the
# reference's embedding of the same sentence.
SENTENCES = (
    ("A man is playing a guitar on the stage.", "Someone performs music with a guitar."),
    ("The cat sleeps on the warm windowsill.", "A kitten is napping by the sunny window."),
    ("Stock prices fell sharply this morning.", "Markets dropped steeply early today."),
    ("She is cooking pasta for dinner.", "A woman prepares spaghetti in the evening."),
    ("The train to Berlin is delayed.", "Our railway connection to Berlin runs late."),
    ("Children are playing football in the park.", "Kids kick a ball around on the grass."),
    ("The phone battery drains too quickly.", "My mobile runs out of charge very fast."),
    ("It will rain heavily tomorrow.", "Tomorrow brings a lot of rain."),
    ("He repaired the bicycle's flat tyre.", "The punctured bike wheel was fixed by him."),
    ("The museum opens at nine o'clock.", "Doors of the gallery open at 9 am."),
    ("Quantization makes the network smaller.", "Lower precision shrinks the model size."),
    ("A dog is running along the beach.", "A puppy races across the sand by the sea."),
)
CALIBRATION_SENTENCES = (
    "The weather was pleasant all week.", "Compilers translate code into machine language.",
    "A bird built a nest in the old oak tree.", "We met at the cafe near the station.",
    "The recipe needs two eggs and some flour.", "Engineers measured the bridge's vibration.",
    "Music filled the small concert hall.", "The library closes early on Sundays.",
    "Satellites orbit the earth every ninety minutes.", "He forgot his umbrella on the bus.",
    "The team celebrated their first victory.", "Fresh bread smells wonderful in the morning.",
    "Solar panels cover the factory roof.", "The river flooded the lower fields.",
    "She learned to play the violin as a child.", "Traffic was light on the highway tonight.",
)


def tokens(tokenizer: Any, texts: Any, length: int = 32) -> list[tuple[Any, Any]]:
    """Each text as (input_ids, attention_mask), 1x``length`` each (padded/cut): int64 ids,
    a float32 0/1 mask."""
    import torch

    tokenizer.enable_padding(length=length)
    tokenizer.enable_truncation(max_length=length)
    out = []
    for text in texts:
        enc = tokenizer.encode(text)
        out.append((torch.tensor([enc.ids], dtype=torch.int64),
                    torch.tensor([enc.attention_mask], dtype=torch.float32)))
    return out
