"""Numeric checks a stage runs on its output: against its parent and against torch.

The export stage stores the example inputs (``example_inputs.npz``) and torch's outputs on
them (``reference_outputs.npz``) in its artifact; every later ONNX stage finds them through
the lineage, so each row of a pipeline can say how far it is from torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .artifact.record import Artifact
from .diagnostics import Diagnostic
from .errors import InputError
from .runtime.ort_runner import OrtRunner
from .tolerances import max_errors, within

INPUTS_FILE = "example_inputs.npz"
REFERENCE_FILE = "reference_outputs.npz"
MAX_FEED_ELEMENTS = 1 << 31  # a random check input larger than this is a damaged shape


def _load_npz(path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def reference_data(artifact: Artifact) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
    """(example inputs by name, torch outputs) from the nearest ancestor that stored them."""
    for art in reversed(artifact.lineage()):
        if INPUTS_FILE in art.files and REFERENCE_FILE in art.files:
            ref = _load_npz(art.dir / REFERENCE_FILE)
            return _load_npz(art.dir / INPUTS_FILE), [ref[k] for k in sorted(ref, key=_order)]
    return None


def _order(key: str) -> int:
    return int(key.rsplit("_", 1)[-1])


def save_reference(folder, inputs: dict[str, np.ndarray], outputs: list[np.ndarray]) -> None:
    np.savez(folder / INPUTS_FILE, **inputs)
    np.savez(folder / REFERENCE_FILE, **{f"output_{i}": o for i, o in enumerate(outputs)})


def random_feeds(graph: Any, example: dict[str, np.ndarray] | None = None,
                 seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Inputs for a numeric check: the example (if any) and random values at other sizes.

    Fixed dims keep their size; symbolic dims take the example's size in the first feed and
    a different size (example + 1, or 2) in the second, so dynamic axes are exercised.
    """
    rng = np.random.default_rng(seed)
    feeds = []
    if example is not None and set(example) == {t.name for t in graph.inputs}:
        feeds.append(example)
    for bump in (False, True):
        feed = {}
        for t in graph.inputs:
            ex = example.get(t.name) if example else None
            shape = []
            for axis, d in enumerate(t.shape or ()):
                if isinstance(d, int):
                    shape.append(d)
                else:
                    base = int(ex.shape[axis]) if ex is not None and ex.ndim > axis else 1
                    shape.append(base + 1 if bump else base)
            elements = int(np.prod(shape, dtype=np.float64)) if shape else 1
            if any(d < 0 for d in shape) or elements > MAX_FEED_ELEMENTS:

                raise InputError(
                    f"input {t.name!r} is declared with shape {shape}: no check input of that "
                    "size can be made (a size below 0, or more than "
                    f"{MAX_FEED_ELEMENTS:.0e} elements)", "the model's declared input shape is "
                    "damaged or wrong: export it again, or pass the inputs to check with (inputs=)")
            feed[t.name] = _random(rng, t.dtype, shape)
        if not bump or any(t.dynamic_dims for t in graph.inputs):
            feeds.append(feed)
    return feeds


def _random(rng: np.random.Generator, dtype: str, shape: list[int]) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def outputs_on(runner: Any, feeds: list[dict[str, np.ndarray]]) -> list[Any]:
    """``runner``'s outputs (a list of arrays) on each feed, or the exception it raised."""
    results: list[Any] = []
    for feed in feeds:
        try:
            results.append(list(runner.run(feed).values()))
        except Exception as e:  # noqa: BLE001 - judged per feed by compare_outputs
            results.append(e)
    return results


def check_against(before: Any, after: Any, feeds: list[dict[str, np.ndarray]], what: str,
                  atol: float, rtol: float) -> tuple[dict[str, Any], list[Diagnostic]]:
    """Run two OrtRunners on the same feeds; max errors and diagnostics for ``what`` changed.

    ``before`` may be its outputs already (``outputs_on``): a caller that drops the runner
    in between holds one model's session at a time, not two (a 1.3 GB model is ~2 GB in
    ONNX Runtime)."""
    ref = before if isinstance(before, list) else outputs_on(before, feeds)
    return compare_outputs(ref, outputs_on(after, feeds), feeds, what, atol, rtol)


def compare_outputs(before: list[Any], after: list[Any], feeds: list[dict[str, np.ndarray]],
                    what: str, atol: float, rtol: float
                    ) -> tuple[dict[str, Any], list[Diagnostic]]:
    """The verdict of check_against from both models' outputs_on the same feeds."""
    worst: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "feeds": 0}
    diags: list[Diagnostic] = []
    for i, (feed, ref, got) in enumerate(zip(feeds, before, after, strict=True)):
        if isinstance(ref, Exception):
            if i == 0:
                diags.append(Diagnostic("warning", "numeric-check-skipped",
                                        f"the input model does not run in ONNX Runtime "
                                        f"({_last_line(ref)}), so {what} was not checked"))
                return {"max_abs": None, "max_rel": None, "feeds": 0}, diags
            continue  # a random size the model itself does not take
        if isinstance(got, Exception):
            diags.append(Diagnostic("error", "numeric-check-failed",
                                    f"{what}: the new model fails on inputs the old one runs "
                                    f"({_describe(feed)}): {_last_line(got)}",
                                    "the transformation broke the graph; use another backend"))
            return {"max_abs": None, "max_rel": None, "feeds": i}, diags
        errs = max_errors(ref, got)
        worst["feeds"] += 1
        worst["max_abs"] = max(worst["max_abs"], errs["max_abs"])
        worst["max_rel"] = max(worst["max_rel"], errs["max_rel"])
        if not within(errs, atol, rtol, ref):
            detail = (f"output shapes {errs['shape_mismatch']}" if errs["shape_mismatch"]
                      else f"max abs {errs['max_abs']:.3g} > tolerance (atol {atol:g}, "
                           f"rtol {rtol:g})")
            diags.append(Diagnostic("error", "numeric-mismatch",
                                    f"{what} changed the numbers on {_describe(feed)}: {detail}",
                                    "do not use this artifact; try another backend, or report "
                                    "the model to the backend's authors"))
            break
    return worst, diags


def error_vs_torch(artifact_path: Any, ref: tuple[dict[str, np.ndarray], list[np.ndarray]] | None,
                   runner: Any = None, outputs: Any = None) -> float | None:
    """Max abs error of an ONNX model against torch's stored outputs on the example inputs
    (``outputs``: the model's own on them, when a check already ran it)."""
    if ref is None:
        return None
    if outputs is None:
        runner = runner or OrtRunner(artifact_path)
        try:
            outputs = list(runner.run(ref[0]).values())
        except Exception:
            return None
    if isinstance(outputs, Exception):
        return None
    got = outputs
    errs = max_errors(ref[1], got)
    return None if errs["shape_mismatch"] else errs["max_abs"]


def _describe(feed: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in feed.items())


def _last_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__
