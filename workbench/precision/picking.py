"""Which samples of a calibration source calibrate, and which are held out to measure the
int8 model on (samples the scales were not fitted to).

``holdout``: "auto" (the default) holds out samples the calibration does not use: when the
source holds more than ``limit``, up to a quarter of ``limit`` (at most 16) of the samples
not picked, the calibration set unchanged; else, from 8 samples up, a quarter of the source
(at most 16), the rest calibrating; a smaller source holds none out (the quantize stage then
measures on the example inputs, or says its figures are in-sample). An int holds out that many, a float in (0, 1) that share
(at most ``limit``); 0 or None none. Every pick uses ``numpy.random.default_rng(seed)``: a
sized source (list, folder, Dataset) reads only the samples picked; a stream (generator,
DataLoader) is reservoir-sampled in one pass, keeping the held-out samples beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .calibration_sources import SampleSource

AUTO = "auto"
AUTO_MAX = 16  # the most samples "auto" holds out
# a source this large or larger is split by "auto" (a quarter held out leaves 6 or more to
# calibrate on); a smaller one keeps every sample: three samples of a seeded MLP's inputs
# calibrated ncnn int8 to 8.5 dB on the fourth, six to 16.5 dB on two more
AUTO_MIN_SOURCE = 8


@dataclass
class Picked:
    """Source positions of the calibration and the held-out samples (ascending), their raw
    values, how many the source held (None: a stream not read to its end), and ``kind``:
    "split" (held out of a source that could calibrate on all), "unpicked" (samples beyond
    ``limit``) or "" (none held out)."""

    indices: list[int]
    values: list[Any]
    held_indices: list[int]
    held_values: list[Any]
    total: int | None
    kind: str


def check_holdout(holdout: Any) -> None:
    """An InputError for a ``holdout=`` that is none of its forms."""
    if holdout is None or holdout == AUTO:
        return
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)):
        raise InputError(f"holdout={holdout!r}: expected 'auto', a count or a share in (0, 1)",
                         "e.g. holdout=8 (samples), holdout=0.25 (a quarter), holdout=0 "
                         "(none: figures in-sample)")
    if isinstance(holdout, float) and not 0 <= holdout < 1:
        raise InputError(f"holdout={holdout!r}: a share must be in [0, 1)",
                         "e.g. holdout=0.25 holds out a quarter of the source")
    if holdout < 0:
        raise InputError(f"holdout={holdout!r} is negative", "give 0 or more samples")


def parse_holdout(text: str) -> Any:
    """``holdout=`` typed as text ("auto", "4", "0.25"), or a hinted InputError."""
    t = text.strip().lower()
    if t in ("", AUTO):
        return AUTO
    for kind in (int, float):
        try:
            value = kind(t)
        except ValueError:
            continue
        check_holdout(value)
        return value
    raise InputError(f"hold out {text!r} is not auto, a count or a share",
                     "e.g. auto, 4 (samples) or 0.25 (a quarter of the source); 0 "
                     "measures on the example inputs")


def _held_count(holdout: Any, total: int, limit: int, where: str) -> tuple[int, str]:
    """(how many of ``total`` samples to hold out, the kind)."""
    if holdout is None or holdout == 0:
        return 0, ""
    if holdout == AUTO:
        if total > limit:
            return min(AUTO_MAX, max(1, limit // 4), total - limit), "unpicked"
        if total >= AUTO_MIN_SOURCE:
            return min(AUTO_MAX, max(1, total // 4)), "split"
        return 0, ""
    k = holdout if isinstance(holdout, int) else min(limit, max(1, round(holdout * total)))
    if total - k < 1:
        raise InputError(
            f"calibration source {where} holds {total} sample(s), too few to hold out "
            f"{k} (holdout={holdout!r}) and calibrate on the rest",
            f"give more samples, a smaller holdout= (at most {total - 1}), or holdout=0 to "
            "measure on the example inputs (or in-sample)")
    return k, "split"


def pick(reader: SampleSource, limit: int, holdout: Any, rng: Any, progress: bool) -> Picked:
    """The calibration and held-out samples of ``reader``."""
    if reader.total is not None:
        total = reader.total
        k, kind = _held_count(holdout, total, limit, reader.description)
        cal, held = _split(total, limit, k, kind, rng)
        values = _read(reader, sorted(set(cal) | set(held)), progress)
        return Picked(cal, [values[i] for i in cal], held, [values[i] for i in held], total,
                      kind)
    extra = _stream_extra(holdout, limit)
    idx, raw, n = _reservoir(reader, limit + extra, rng, progress)
    k, kind = _held_count(holdout, len(raw), limit, reader.description) if raw else (0, "")
    cal, held = _split(len(raw), limit, k, kind, rng)
    return Picked([idx[i] for i in cal], [raw[i] for i in cal], [idx[i] for i in held],
                  [raw[i] for i in held], n, kind)


def _stream_extra(holdout: Any, limit: int) -> int:
    """How many more than ``limit`` a stream's reservoir keeps for the held-out samples."""
    if holdout is None or holdout == 0:
        return 0
    if holdout == AUTO:
        return AUTO_MAX
    if isinstance(holdout, int):
        return holdout
    return min(limit, math.ceil(limit * holdout / (1 - holdout)))


def _split(total: int, limit: int, k: int, kind: str, rng: Any) -> tuple[list[int], list[int]]:
    """(calibration positions, held-out positions) among ``total``, both ascending. Without
    a holdout, or with "unpicked", the calibration pick is the one it always was."""
    import numpy as np

    if kind in ("", "unpicked"):
        cal = (sorted(int(i) for i in rng.choice(total, size=limit, replace=False))
               if total > limit else list(range(total)))
        if not k:
            return cal, []
        rest = np.setdiff1d(np.arange(total), cal)
        return cal, sorted(int(i) for i in rng.choice(rest, size=k, replace=False))
    held = sorted(int(i) for i in rng.choice(total, size=k, replace=False))
    rest = np.setdiff1d(np.arange(total), held)
    cal = rest if len(rest) <= limit else rng.choice(rest, size=limit, replace=False)
    return sorted(int(i) for i in cal), held


def _read(reader: SampleSource, picked: list[int], progress: bool) -> dict[int, Any]:
    from tqdm.auto import tqdm

    assert reader.get is not None
    out = {}
    for i in tqdm(picked, desc="calibration: reading", unit="sample", disable=not progress,
                  leave=False):
        try:
            out[i] = reader.get(i)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's Dataset failed on this index
            raise InputError(f"reading calibration source {reader.description} failed at "
                             f"sample {i}: {type(e).__name__}: {e}",
                             "the source's own error is above; check the Dataset's "
                             "__getitem__") from e
    return out


def _reservoir(reader: SampleSource, size: int, rng: Any,
               progress: bool) -> tuple[list[int], list[Any], int]:
    """Algorithm R over the whole source: ``size`` samples uniformly, in one pass, keeping
    at most ``size`` in memory (a DataLoader over a big dataset is never held whole)."""
    from tqdm.auto import tqdm

    items = reader.items() if reader.items is not None else (
        reader.get(i) for i in range(reader.total or 0))  # type: ignore[misc]
    kept: list[tuple[int, Any]] = []
    n = 0
    try:
        for n, value in enumerate(tqdm(items, desc="calibration: reading", unit="sample",
                                       total=reader.total, disable=not progress,
                                       leave=False), start=1):
            i = n - 1
            if len(kept) < size:
                kept.append((i, value))
            else:
                j = int(rng.integers(0, n))
                if j < size:
                    kept[j] = (i, value)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's iterable or Dataset failed
        raise InputError(f"reading calibration source {reader.description} failed at sample "
                         f"{n}: {type(e).__name__}: {e}",
                         "the source's own error is above; check the Dataset's __getitem__ "
                         "or the generator") from e
    kept.sort(key=lambda t: t[0])
    return [i for i, _ in kept], [v for _, v in kept], n
