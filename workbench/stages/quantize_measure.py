"""The int8 model against its float parent, on samples it was not calibrated on.

Held out, in order of preference: the samples the calibration set aside (``picking``: a
split of the source, or samples beyond ``limit``), else the example inputs stored with the
lineage (when no calibration sample equals them), else (said by an ``int8-in-sample``
warning) the calibration samples themselves. On each, the SNR of every output against the
parent's; the figure is the median over the samples of the worst output's SNR, with the
spread (min / median / max) and where it was measured, and the same over a few calibration
samples (``in_sample``) beside it. A task metric, when given, scores the int8 outputs
against the parent's over the held-out samples. Outputs bit-identical to the parent's on
every sample never ran in int8: an ``int8-not-exercised`` error, never a figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..artifact.record import Artifact
from ..checks import random_feeds, reference_data
from ..diagnostics import Diagnostic
from ..precision.snr import snr_db

IN_SAMPLE_MAX = 4  # calibration samples measured for the in-sample figure
# static int8 whose output keeps less than this SNR against its parent has lost the signal
COLLAPSE_DB = 3.0
KIND_WORDS = {"split": "samples held out of the calibration source",
              "unpicked": "samples of the calibration source beyond its limit",
              "example": "the example inputs",
              "calibration": "the calibration samples themselves (in-sample)"}


@dataclass
class HeldOut:
    """The samples to measure on, their ``kind`` (a key of KIND_WORDS) and their source
    indices (none for the example inputs)."""

    samples: list[tuple[Any, ...]]
    kind: str
    indices: list[int]


def example_inputs(source: Artifact, given: Any = None) -> tuple | None:
    """The example inputs in input order: ``given`` (a tensor/array or a tuple of them, as
    ``wb.export`` takes them), else those stored with the lineage (None: none)."""
    from ..errors import InputError
    from ..runtime.base import to_numpy

    if given is not None:
        xs = tuple(given) if isinstance(given, (tuple, list)) else (given,)
        if len(xs) != len(source.graph.inputs):
            raise InputError(f"example= holds {len(xs)} input(s); {source.id} takes "
                             f"{len(source.graph.inputs)}",
                             "give the example inputs the model was exported with, in order")
        return tuple(to_numpy(x) for x in xs)
    ref = reference_data(source)
    if not ref or set(ref[0]) != {t.name for t in source.graph.inputs}:
        return None
    return tuple(ref[0][t.name] for t in source.graph.inputs)


def example_or_random(source: Artifact, ex: tuple | None) -> tuple:
    """The example inputs, else seeded random ones of the declared shapes."""
    if ex is not None:
        return ex
    feed = random_feeds(source.graph, None, 0)[0]
    return tuple(feed[t.name] for t in source.graph.inputs)


def held_out(cal: Any, source: Artifact, ex: tuple | None) -> HeldOut:
    """Where the int8 model is measured (see the module's docstring); ``ex``: the example
    inputs (None: unknown)."""
    import numpy as np

    if cal is None:  # dynamic quantization: nothing calibrated, the example is held out
        return HeldOut([example_or_random(source, ex)], "example", [])
    if cal.heldout:
        return HeldOut(list(cal.heldout), cal.heldout_kind, list(cal.heldout_indices))
    if ex is not None and len(ex) == len(cal.inputs) and not any(
            all(np.shape(a) == np.shape(b) and np.array_equal(a, b)
                for a, b in zip(ex, s, strict=True)) for s in cal.samples):
        return HeldOut([ex], "example", [])
    return HeldOut(list(cal.samples[:IN_SAMPLE_MAX]), "calibration",
                   list(cal.indices[:IN_SAMPLE_MAX]))


def _spread(values: list[float]) -> dict[str, float | None]:
    import numpy as np

    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return {"min": None, "median": None, "max": None}
    return {"min": float(np.min(finite)), "median": float(np.median(finite)),
            "max": float(np.max(finite))}


def _run(parent: Any, child: Any, samples: list[tuple], keep: bool
         ) -> tuple[list[dict[str, float]], bool, list[tuple[dict, dict]]]:
    """Per sample {output: SNR}; whether any output differed; the outputs (``keep``)."""
    import numpy as np

    per, differs, outputs = [], False, []
    for s in samples:
        ref, got = parent.run(s), child.run(s)
        names = [n for n in ref if n in got]
        per.append({n: snr_db(ref[n], got[n]) for n in names})
        differs = differs or any(not np.array_equal(np.asarray(ref[n]), np.asarray(got[n]))
                                 for n in names)
        if keep:
            outputs.append((ref, got))
    return per, differs, outputs


def measure(parent: Any, child: Any, cal: Any, source: Artifact, task: Any = None,
            example: tuple | None = None) -> tuple[list[Diagnostic], dict[str, Any]]:
    """The int8 ``child`` against its float ``parent`` (runners) on held-out samples: the
    diagnostics and the metrics (``min_snr_db_vs_parent``: the held-out median of the worst
    output's SNR; ``snr_db_vs_parent``: per output, its median; ``heldout``: where, how many,
    the spread, each sample's figure, the task score; ``in_sample``: the spread over a few
    calibration samples)."""
    held = held_out(cal, source, example)
    per, differs, outputs = _run(parent, child, held.samples, task is not None)
    worst = [min(d.values()) if d else float("nan") for d in per]
    names = list(per[0]) if per else []
    spread = _spread(worst)
    metrics: dict[str, Any] = {
        "snr_db_vs_parent": {n: _spread([d[n] for d in per])["median"] for n in names},
        "min_snr_db_vs_parent": spread["median"],
        "heldout": {"kind": held.kind, "on": KIND_WORDS[held.kind], "count": len(per),
                    "indices": held.indices, "snr_db": spread, "per_sample": worst}}
    diags = []
    if per and not differs:
        diags.append(Diagnostic(
            "error", "int8-not-exercised",
            f"the quantized model's outputs are bit-identical to {source.id}'s on "
            f"{len(per)} sample(s) ({KIND_WORDS[held.kind]}): no layer ran in int8",
            "check that some layer was quantized (metrics 'quantized') and not every one "
            "excluded"))
        metrics["min_snr_db_vs_parent"] = None
    if held.kind == "calibration":
        diags.append(Diagnostic(
            "warning", "int8-in-sample",
            f"the int8 figures are measured on {len(per)} of the calibration samples "
            "themselves (the source holds too few to hold any out, and no example inputs "
            "are stored with the model): they flatter the int8 model",
            "give more samples (from 8 up, a quarter is held out), or holdout=1 or more, "
            "or the example inputs: wb.quantize(..., example=inputs)"))
    elif cal is not None:
        in_per, _, _ = _run(parent, child, list(cal.samples[:IN_SAMPLE_MAX]), False)
        metrics["in_sample"] = {"count": len(in_per), "snr_db": _spread(
            [min(d.values()) if d else float("nan") for d in in_per])}
    if held.kind == "example":
        metrics["example_snr_db"] = worst[0] if worst else None
    elif example is not None and cal is not None and len(example) == len(cal.inputs):
        # the model's own input, beside samples prepared as the calibration was (a folder
        # read without the model's preprocessing shows here what it costs)
        ex_per, _, _ = _run(parent, child, [example], False)
        metrics["example_snr_db"] = min(ex_per[0].values()) if ex_per[0] else None
    if task is not None:
        metrics["heldout"]["task"], note = _task(task, outputs)
        diags.extend(note)
    return diags, metrics


def _task(task: Any, outputs: list[tuple[dict, dict]]) -> tuple[dict | None, list[Diagnostic]]:
    """The task metric's score of the int8 outputs against the parent's (a dict), or None
    with an info diagnostic saying why it could not score them."""
    out = getattr(task, "output", 0)
    try:
        def pick(d: dict) -> Any:
            return d[out] if isinstance(out, str) else list(d.values())[out]
        score = task.score([pick(r) for r, _ in outputs], [pick(g) for _, g in outputs])
    except Exception as e:  # noqa: BLE001 - a task that cannot score these is said, not fatal
        return None, [Diagnostic("info", "int8-task-not-scored",
                                 f"the task metric could not score the held-out outputs: "
                                 f"{type(e).__name__}: {e}",
                                 "hold out more samples (holdout=), or score with "
                                 "wb.compare(..., task=...)")]
    return score.as_dict(), []


def static_collapse(source: Artifact, metrics: dict[str, Any]) -> list[Diagnostic]:
    """A static QDQ model of a MatMul graph (a transformer) whose output lost its signal:
    static ranges do not fit activations that vary per token, onnxruntime's dynamic MatMul
    quantization does (all-MiniLM-L6-v2: -1.3 dB static, 12.0 dB dynamic)."""
    snr = metrics.get("min_snr_db_vs_parent")
    if snr is None or snr >= COLLAPSE_DB or "MatMul" not in source.graph.op_histogram:
        return []
    return [Diagnostic(
        "warning", "int8-static-collapsed",
        f"static int8 kept {snr:.1f} dB of {source.id}'s output (below {COLLAPSE_DB:g} dB: the "
        "signal is lost) in a graph of MatMuls",
        "quantize the MatMuls dynamically instead: wb.quantize(onx, dynamic=True) (int8 "
        "weights, activations quantized at each run); or rank the layers "
        "(rep.sensitivity()) and keep the costly ones float with exclude=")]
