"""Pipeline: every stage that exists, one after another, in one result object."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .artifact.record import Artifact
from .artifact.workspace import Workspace, as_workspace
from .comparison.compare import compare
from .errors import WorkbenchError
from .stages.export import export
from .stages.ncnn import to_ncnn
from .stages.raising import raise_ops
from .stages.simplify import simplify

STAGES = ("export", "simplify", "raise", "ncnn", "compare")


@dataclass
class PipelineResult:
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    errors: dict[str, WorkbenchError] = field(default_factory=dict)
    seconds: float = 0.0
    report: Any = None  # the op-by-op CompareReport of the last ONNX and the ncnn model

    @property
    def ok(self) -> bool:
        return (not self.errors and all(a.ok for a in self.artifacts.values())
                and (self.report is None or self.report.ok))

    def rows(self) -> list[dict[str, Any]]:
        """One row per stage: stage, artifact id, format, nodes, max abs vs torch, seconds."""
        rows = []
        for stage, art in self.artifacts.items():
            # an ncnn artifact is run twice: fp32 and fp16 arithmetic/storage
            variants = ([(f"{stage} fp32", "max_abs"), (f"{stage} fp16", "max_abs_fp16")]
                        if art.format == "ncnn" else [(stage, "max_abs")])
            for label, key in variants:
                rows.append({"stage": label, "artifact": art.id, "format": art.format,
                             "nodes": art.graph.node_count, "max_abs_vs_torch": art.metrics.get(key),
                             "seconds": round(art.seconds, 3),
                             "status": "ok" if art.ok else "errors",
                             "warnings": sum(d.level == "warning" for d in art.diagnostics)})
        for stage, e in self.errors.items():
            rows.append({"stage": stage, "artifact": "-", "format": "-", "nodes": None,
                         "max_abs_vs_torch": None, "seconds": None, "status": "failed",
                         "warnings": 0, "error": e.message})
        return rows

    def table(self) -> str:
        """The rows as a fixed-width text table (what `workbench demo` prints)."""
        head = ["stage", "artifact", "format", "nodes", "max abs vs torch", "seconds", "status"]
        body = [[r["stage"], r["artifact"], r["format"], _fmt(r["nodes"]),
                 _fmt(r["max_abs_vs_torch"], "{:.3g}"), _fmt(r["seconds"], "{:.2f}"),
                 r["status"]] for r in self.rows()]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
        lines = ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip()
                 for row in [head, ["-" * w for w in widths], *body]]
        lines += [f"{stage} failed: {e.message.splitlines()[0]}" for stage, e in self.errors.items()]
        if self.report is not None:
            lines += ["", "op by op:", self.report.summary()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _fmt(v: Any, spec: str = "{}") -> str:
    return "-" if v is None else spec.format(v)


class Pipeline:
    """Run export, simplify, raising, ncnn conversion and the op-by-op comparison on one model.

    ``export``, ``simplify``, ``raise_ops``, ``ncnn`` and ``compare`` are dicts of keyword
    arguments for those stages; ``raise_ops=False`` skips raising.
    """

    def __init__(self, model: Any, inputs: Any, *, workspace: Workspace | str | None = None,
                 export: dict[str, Any] | None = None,
                 simplify: dict[str, Any] | None = None,
                 raise_ops: dict[str, Any] | bool | None = None,
                 ncnn: dict[str, Any] | None = None,
                 compare: dict[str, Any] | None = None) -> None:
        self.model = model
        self.inputs = inputs
        self.workspace = workspace
        self.options = {"export": dict(export or {}), "simplify": dict(simplify or {}),
                        "raise": dict(raise_ops) if isinstance(raise_ops, dict) else {}, "ncnn": dict(ncnn or {}),
                        "compare": dict(compare or {})}
        self.stages = tuple(s for s in STAGES if s != "raise" or raise_ops is not False)

    def run(self, progress: bool = True) -> PipelineResult:
        from tqdm.auto import tqdm

        ws = as_workspace(self.workspace)
        result = PipelineResult()
        t0 = time.perf_counter()
        bar = tqdm(self.stages, desc="pipeline", disable=not progress, leave=False)
        for stage in bar:
            bar.set_postfix_str(stage)
            try:
                if stage == "export":
                    art = export(self.model, self.inputs, workspace=ws, **self.options[stage])
                elif stage == "simplify":
                    art = simplify(result.artifacts["export"], workspace=ws,
                                   **self.options[stage])
                elif stage == "raise":  # on the simplified graph, else on the export
                    parent = result.artifacts.get("simplify", result.artifacts["export"])
                    art = raise_ops(parent, workspace=ws, **self.options[stage])
                elif stage == "ncnn":  # pnnx from the module: its TorchScript route raises
                    art = to_ncnn(self.model, self.inputs, workspace=ws, **self.options[stage])
                else:
                    onnx = next(result.artifacts[s] for s in ("raise", "simplify", "export")
                                if s in result.artifacts)  # the last ONNX model
                    cands = [onnx] + ([result.artifacts["ncnn"]] if "ncnn" in result.artifacts
                                      else [])
                    result.report = compare(self.model, cands, self.inputs, progress=False,
                                            **self.options[stage])
                    continue
            except WorkbenchError as e:  # keep what was written, say where it stopped
                result.errors[stage] = e
                if stage == "export":  # nothing after it can run
                    break
                continue
            result.artifacts[stage] = art
        bar.close()
        result.seconds = time.perf_counter() - t0
        return result
