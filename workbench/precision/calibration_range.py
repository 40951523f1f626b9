"""Calibration samples against the example inputs, before calibrating: a range far from the
one the model is run on (images read as [0, 1] for a model trained on ImageNet-normalised
input, [-2.1, 2.6]) calibrates int8 scales for data the model never sees, and the int8 model
loses what the float one keeps. Flagged as a diagnostic naming both ranges, with the fix.
"""

from __future__ import annotations

from typing import Any

from ..diagnostics import Diagnostic

# ranges overlapping over less than this share of their union are "far apart"
FAR_OVERLAP = 0.5
PREPROCESS_HINT = ("give the source the model's preprocessing, set once for both backends: "
                   "wb.quantize(art, folder, preprocess={'mean': [0.485, 0.456, 0.406], "
                   "'std': [0.229, 0.224, 0.225]}) with the model's own values (or "
                   "CalibrationSource(folder, Preprocess(...)) from "
                   "workbench.precision.preprocess); in the Quantize panel, the mean / std / "
                   "scale fields")


def span(arrays: list[Any]) -> tuple[float, float] | None:
    """(min, max) over the finite values of ``arrays`` (None: no float values)."""
    import numpy as np

    lo, hi = np.inf, -np.inf
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind != "f" or not a.size:
            return None
        lo, hi = min(lo, float(np.nanmin(a))), max(hi, float(np.nanmax(a)))
    return None if lo > hi else (lo, hi)


def far_apart(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """The two ranges overlap over less than FAR_OVERLAP of their union."""
    union = max(a[1], b[1]) - min(a[0], b[0])
    if union <= 0:
        return False
    overlap = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    return overlap / union < FAR_OVERLAP


def _fmt(r: tuple[float, float]) -> str:
    return f"[{r[0]:.3g}, {r[1]:.3g}]"


def range_diagnostics(samples: list[tuple[Any, ...]], names: list[str],
                      example: tuple[Any, ...] | None, source: str, default_images: bool
                      ) -> list[Diagnostic]:
    """The calibration samples' range per float input against the example inputs'.

    ``default_images``: the samples are images read without preprocessing (RGB/255): always
    said (a warning when the example inputs span another range or are unknown, info when
    they agree). Otherwise a warning only where the ranges are far apart."""
    out = []
    for i, name in enumerate(names):
        cal = span([s[i] for s in samples])
        if cal is None:
            continue
        ex = span([example[i]]) if example is not None and i < len(example) else None
        far = ex is not None and far_apart(cal, ex)
        given = (f"the example inputs span {_fmt(ex)}" if ex is not None
                 else "the example inputs are not stored with this artifact")
        if default_images:
            level = "warning" if far or ex is None else "info"
            out.append(Diagnostic(
                level, "calibration-no-preprocessing",
                f"calibration images of {source} were read without preprocessing (RGB / 255, "
                f"no mean/std): input {name!r} gets values in {_fmt(cal)}; {given}"
                + ("; int8 scales fitted to these would not fit the model's real inputs"
                   if far else ""),
                PREPROCESS_HINT if level == "warning" else
                "the ranges agree; set preprocess= when the model expects normalised input"))
        elif far:
            out.append(Diagnostic(
                "warning", "calibration-range",
                f"calibration samples of {source} span {_fmt(cal)} at input {name!r}; "
                f"{given}: int8 scales fitted to the samples would not fit the model's real "
                "inputs", "prepare the samples as the example inputs are (the same "
                "scale, mean and std), or give the source its preprocessing: " + PREPROCESS_HINT))
    return out
