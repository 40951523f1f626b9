"""Signal-to-noise ratio in dB: the figure precision is judged by (PPQ and onnxruntime's
``qdq_loss_debug`` report it too). ``10 log10(sum ref^2 / sum (ref - got)^2)``; inf when
the two are equal, so "never ran in low precision" shows up as inf rather than a number."""

from __future__ import annotations

from typing import Any


def snr_db(ref: Any, got: Any) -> float:
    """SNR of ``got`` against ``ref`` in dB (same number of elements; reshaped as ``ref``)."""
    import numpy as np

    a = np.asarray(ref, dtype=np.float64).reshape(-1)
    b = np.asarray(got, dtype=np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"snr_db: {a.size} reference elements, {b.size} compared")
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(a ** 2))
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))
