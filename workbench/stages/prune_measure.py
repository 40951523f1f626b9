"""The unpruned and the pruned model as a backend gets them: each exported to ONNX
(``wb.export``) and converted to ncnn (``wb.to_ncnn`` of that ONNX), their files weighed, and
both run alternately in this process (each round runs every model once, the order rotating,
so load that comes and goes hits all alike); a latency is the median of the rounds.

The export and the conversion each check their output against torch (in the crash-isolating
worker), so a model that crashes its backend is stopped there, before anything runs here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace
from ..errors import WorkbenchError
from .export import export
from .ncnn import to_ncnn
from .prune_report import BeforeAfter

BACKENDS = ("onnxruntime", "ncnn")


@dataclass
class Measured:
    """The backend figures of one unpruned/pruned pair, by PruneReport field name."""

    figures: dict[str, BeforeAfter] = field(default_factory=dict)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)


def measure_backends(base: Any, pruned: Any, inputs: tuple, backends: Sequence[str],
                     workspace: Workspace, *, threads: int, repeat: int, warmup: int,
                     export_options: Mapping[str, Any], step: Callable[[str], None]
                     ) -> Measured:
    """Export, convert, weigh and time ``base`` and ``pruned`` on ``inputs``.

    ``step(phase)`` is called as each of the export, conversion and timing steps starts.
    A stage that fails for either model is recorded in ``errors`` (keyed "onnx" / "ncnn")
    and its figures left out; ncnn needs the ONNX files."""
    out = Measured()
    models = {"": base, " pruned": pruned}
    try:
        for tag, model in models.items():
            step(f"export{tag}")
            out.artifacts[f"onnx{tag}"] = export(model, inputs, workspace=workspace,
                                                 **dict(export_options))
    except WorkbenchError as err:
        out.errors["onnx"] = err
        return out
    onnx = out.artifacts["onnx"], out.artifacts["onnx pruned"]
    out.figures["onnx_nodes"] = BeforeAfter(*(a.graph.node_count for a in onnx))
    out.figures["onnx_bytes"] = BeforeAfter(*(_bytes(a, ".onnx") for a in onnx))
    if "ncnn" in backends:
        try:
            for tag in models:
                step(f"ncnn{tag}")
                out.artifacts[f"ncnn{tag}"] = to_ncnn(out.artifacts[f"onnx{tag}"],
                                                      workspace=workspace)
            out.figures["ncnn_bin_bytes"] = BeforeAfter(
                *(_bytes(out.artifacts[k], ".bin") for k in ("ncnn", "ncnn pruned")))
        except WorkbenchError as err:
            out.errors["ncnn"] = err
    step("timing")
    out.figures.update(_latencies(out.artifacts, backends, inputs, threads, repeat, warmup))
    return out


def _bytes(artifact: Artifact, suffix: str) -> int:
    """Bytes of the artifact's files ending in ``suffix`` (an ONNX model with its external
    data counts both)."""
    sizes = [rec.get("bytes", 0) for name, rec in artifact.files.items()
             if name.endswith(suffix) or (suffix == ".onnx" and name.endswith(".data"))]
    if sizes:
        return int(sum(sizes))
    return artifact.path.stat().st_size


def _latencies(artifacts: dict[str, Artifact], backends: Sequence[str], inputs: tuple,
               threads: int, repeat: int, warmup: int) -> dict[str, BeforeAfter]:
    """Median milliseconds of each backend's unpruned and pruned model, timed alternately
    in this process (``isolated=False``: the worker's transfer would blur a small model)."""
    from ..runtime import NcnnRunner, OrtRunner

    runners: dict[tuple[str, str], Any] = {}
    for tag in ("", " pruned"):
        if "onnxruntime" in backends and f"onnx{tag}" in artifacts:
            runners[("ort_ms", tag)] = OrtRunner(artifacts[f"onnx{tag}"], isolated=False,
                                                 num_threads=threads)
        if "ncnn" in backends and f"ncnn{tag}" in artifacts:
            runners[("ncnn_ms", tag)] = NcnnRunner(artifacts[f"ncnn{tag}"], isolated=False,
                                                   num_threads=threads)
    feed = tuple(t.detach().cpu().numpy() for t in inputs)
    times: dict[tuple[str, str], list[float]] = {k: [] for k in runners}
    keys = list(runners)
    for r in range(warmup + repeat):
        shift = r % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            t0 = time.perf_counter()
            runners[key].run(feed, capture="outputs")
            if r >= warmup:
                times[key].append(time.perf_counter() - t0)
    out = {}
    for field_name in ("ort_ms", "ncnn_ms"):
        if (field_name, "") in times and (field_name, " pruned") in times:
            out[field_name] = BeforeAfter(
                statistics.median(times[(field_name, "")]) * 1e3,
                statistics.median(times[(field_name, " pruned")]) * 1e3)
    return out
