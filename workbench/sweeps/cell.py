"""One cell: a model through export, simplify, raise, ncnn and the op-by-op comparison, each
stage's outcome a typed ``StageResult``; run as ``python -m workbench.sweeps.cell SPEC.json`` in
a fresh process, so a native crash costs this cell only.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import WorkbenchError
from .matrix import Cell

STAGES = ("model", "export", "simplify", "raise", "ncnn", "compare")
# A stage's status: ran and its checks passed; ran but a check failed (numbers off, checker);
# raised; not run because an earlier stage failed; not chosen in this cell's matrix.
STATUSES = ("ok", "mismatch", "failed", "crashed", "skipped", "off")
BAD = ("mismatch", "failed", "crashed")


@dataclass
class StageResult:
    """What one stage of one cell did."""

    stage: str
    status: str
    error_class: str = ""
    error: str = ""
    hint: str = ""
    nodes: int | None = None
    max_abs: float | None = None  # vs torch (ncnn: its fp32 run)
    max_abs_fp16: float | None = None
    aligned_fraction: float | None = None  # from the comparison, for a compared candidate
    first_divergence: str = ""
    seconds: float = 0.0
    warnings: int = 0
    artifact: str = ""  # path relative to the cell's folder
    tools: dict[str, str] = field(default_factory=dict)


@dataclass
class OpPoint:
    """One aligned tensor of the comparison (accumulated mode): for the op-by-op plots."""

    candidate: str
    order: int
    reference: str
    op_type: str
    max_abs: float | None
    passed: bool


@dataclass
class CellResult:
    cell_id: str
    stages: list[StageResult]
    ops: list[OpPoint] = field(default_factory=list)
    seconds: float = 0.0
    worker: str = ""
    attempts: int = 1

    @property
    def status(self) -> str:
        """'ok' when no stage is bad, else the first bad stage's status."""
        return next((s.status for s in self.stages if s.status in BAD), "ok")

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> CellResult:
        d = json.loads(text)
        return cls(cell_id=d["cell_id"], stages=[StageResult(**s) for s in d["stages"]],
                   ops=[OpPoint(**o) for o in d.get("ops", [])], seconds=d.get("seconds", 0.0),
                   worker=d.get("worker", ""), attempts=d.get("attempts", 1))

    @classmethod
    def crashed(cls, cell_id: str, why: str, hint: str, seconds: float = 0.0,
                log: str = "") -> CellResult:
        """The result of a cell whose process died: the whole cell is one crashed stage."""
        msg = why + (f"\n{log}" if log else "")
        return cls(cell_id, [StageResult("model", "crashed", "BackendCrashed", msg, hint,
                                         seconds=seconds)], seconds=seconds)


def run_cell(cell: Cell, folder: Path) -> CellResult:
    """Run every stage of ``cell`` with its artifacts in ``folder`` (a Workspace)."""
    from ..artifact import Workspace, tool_versions

    t0 = time.perf_counter()
    tools = tool_versions()
    ws = Workspace(folder)
    opts = cell.options
    out: dict[str, StageResult] = {}
    arts: dict[str, Any] = {}
    ops: list[OpPoint] = []
    model = inputs = None

    def run(stage: str, fn: Any) -> Any:
        t = time.perf_counter()
        try:
            value = fn()
        except Exception as e:  # every stage's failure is this cell's record, never fatal
            out[stage] = _failed(stage, e, folder)
            value = None
        else:
            out[stage] = _from_artifact(stage, value, folder) if hasattr(value, "graph") else \
                StageResult(stage, "ok")
        out[stage].seconds = round(time.perf_counter() - t, 3)
        out[stage].tools = tools
        return value

    from .factory import model_and_inputs

    built = run("model", lambda: model_and_inputs(cell.model))
    if built is not None:
        model, inputs = built
        exp = {"exporter": opts["exporter"]} | ({"opset": opts["opset"]} if opts["opset"] else {})
        from ..stages.export import export

        arts["export"] = run("export", lambda: export(model, inputs, workspace=ws, **exp))
    if arts.get("export") is not None:
        if opts["simplify"] != "none":
            from ..stages.simplify import simplify

            arts["simplify"] = run("simplify", lambda: simplify(
                arts["export"], backend=opts["simplify"], workspace=ws))
        if opts["raise"]:
            from ..stages.raising import raise_ops

            parent = arts.get("simplify") or arts["export"]
            arts["raise"] = run("raise", lambda: raise_ops(parent, workspace=ws))
    if built is not None and opts["ncnn"] != "none":
        from ..stages.ncnn import to_ncnn

        arts["ncnn"] = run("ncnn", lambda: to_ncnn(model, inputs, workspace=ws,
                                                   fp16=opts["ncnn"] == "fp16"))
    onnx_stage = next((s for s in ("raise", "simplify", "export") if arts.get(s) is not None),
                      None)
    cands = [(s, arts[s]) for s in (onnx_stage, "ncnn") if s and arts.get(s) is not None]
    if cands:
        from ..comparison.compare import compare

        rep = run("compare", lambda: compare(model, [a for _, a in cands], inputs,
                                              progress=False))
        if rep is not None:
            _record_comparison(rep, cands, out, ops)
    for stage in STAGES:  # what did not run: not chosen, or an earlier stage failed
        if stage not in out:
            chosen = not ((stage == "simplify" and opts["simplify"] == "none")
                          or (stage == "raise" and not opts["raise"])
                          or (stage == "ncnn" and opts["ncnn"] == "none"))
            out[stage] = StageResult(stage, "skipped" if chosen else "off", tools=tools)
    return CellResult(cell.id, [out[s] for s in STAGES], ops,
                      seconds=round(time.perf_counter() - t0, 3))


def _from_artifact(stage: str, art: Any, folder: Path) -> StageResult:
    errors = [d for d in art.diagnostics if d.level == "error"]
    first = errors[0] if errors else None
    try:
        rel = str(art.path.relative_to(folder))
    except ValueError:
        rel = str(art.path)
    return StageResult(
        stage, "mismatch" if errors else "ok",
        error_class=first.code if first else "", error=first.message if first else "",
        hint=(first.hint or "") if first else "", nodes=art.graph.node_count,
        max_abs=_num(art.metrics.get("max_abs")), max_abs_fp16=_num(art.metrics.get("max_abs_fp16")),
        warnings=sum(d.level == "warning" for d in art.diagnostics), artifact=rel)


def _failed(stage: str, e: BaseException, folder: Path) -> StageResult:
    """A raised stage: its error class, message and hint (a traceback kept in errors.log)."""
    with open(folder / "errors.log", "a") as f:
        f.write(f"--- {stage}\n{''.join(traceback.format_exception(e))}\n")
    if isinstance(e, WorkbenchError):
        return StageResult(stage, "failed", type(e).__name__, e.message, e.hint)
    return StageResult(stage, "failed", type(e).__name__, str(e) or repr(e),
                       f"an unexpected {type(e).__name__} in {stage}: the traceback is in "
                       "this cell's errors.log")


def _record_comparison(rep: Any, cands: list[tuple[str, Any]], out: dict[str, StageResult],
                       ops: list[OpPoint]) -> None:
    """The comparison's verdicts onto the compare row, and each candidate's aligned fraction
    and first divergence onto the row of the stage that made it."""
    names = [c.name for c in rep.candidates]
    stage_of = {name: stage for (stage, _), name in zip(cands, names, strict=False)}
    fractions = rep.aligned_fraction
    divergences = rep.divergences()
    verdicts = rep.verdicts()
    for (stage, _), name in zip(cands, names, strict=False):
        row = out[stage]
        row.aligned_fraction = _num(fractions.get(name))
        div = divergences.get(name)
        if div is not None:
            row.first_divergence = (f"{div.reference} ({div.op_type} {div.name}, "
                                    f"max abs {div.metrics.max_abs:.3g})")
    row = out["compare"]
    bad = [v for v in verdicts.values() if not v.ok]
    if bad:
        row.status = "mismatch"
        row.error_class = "tolerance"
        row.error = rep.summary()
        row.hint = "open the comparison: wb.compare(model, [...], inputs).table(), or the " \
                   "first divergence's repro (rep.repro)"
    for r in rep.records:
        if r.mode == "accumulated":
            ops.append(OpPoint(stage_of.get(r.candidate, r.candidate), int(r.order), r.reference, r.op_type,
                               _num(r.metrics.max_abs), bool(r.metrics.passed)))


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def main(argv: list[str]) -> int:
    """``python -m workbench.sweeps.cell SPEC.json``: SPEC holds the cell, its folder and where
    to write the result (atomically: a reader sees the whole result or none)."""
    from ..fileio import atomic_write_text

    spec = json.loads(Path(argv[0]).read_text())
    cell = Cell(spec["model"], spec["name"], tuple((k, v) for k, v in spec["choices"]))
    folder = Path(spec["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    result = run_cell(cell, folder)
    atomic_write_text(Path(spec["result"]), result.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
