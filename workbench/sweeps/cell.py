"""One cell: a model through export, simplify, raise, ncnn and the op-by-op comparison, each
stage's outcome a typed ``StageResult``; run as ``python -m workbench.sweeps.cell SPEC.json`` in
a fresh process, so a native crash costs this cell only.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..artifact.tools import tool_versions
from ..artifact.workspace import Workspace
from ..comparison.compare import compare
from ..comparison.metrics import Tolerance
from ..errors import WorkbenchError
from ..fileio import atomic_write_text
from ..stages.export import export
from ..stages.ncnn import to_ncnn
from ..stages.quantize import quantize
from ..stages.raising import raise_ops
from ..stages.simplify import simplify
from ..tolerances import INT8_MIN_SNR_DB, for_precision
from .cell_target import NCNN_STAGES, check_on_target, ncnn_runners
from .factory import model_and_inputs
from .matrix import FP16_WEIGHTS, Cell, run_precision

STAGES = ("model", "export", "simplify", "raise", "ncnn", "ort-int8", "ncnn-int8", "compare")
INT8_STAGES = ("ort-int8", "ncnn-int8")
CALIBRATION_SAMPLES = 4  # the example inputs and 3 seeded samples like them
# A stage's status: ran and its checks passed; ran but a check failed (numbers off, checker);
# raised; its process died; its process tree passed the memory limit and was stopped
# (sweeps/memory.py); not run because an earlier stage failed; not chosen in this cell's matrix.
STATUSES = ("ok", "mismatch", "failed", "crashed", "out-of-memory", "skipped", "off")
BAD = ("mismatch", "failed", "crashed", "out-of-memory")
RUNNING = ".stage"  # in a cell's folder: the stage running now (which one ran out of memory)


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
    # the tolerance this stage's candidate was compared with (workbench.tolerances, by its
    # precision); int8: its output SNR vs its float parent and the bar it had to reach
    atol: float | None = None
    rtol: float | None = None
    snr_db: float | None = None
    min_snr_db: float | None = None
    # ncnn stages: where the candidate ran ("" this machine, else the ARM target) and the
    # precision features that ran there (NcnnFlags.label: "fp32", "fp16 arithmetic"...);
    # on a target, its output check's max abs vs torch there (max_abs stays the conversion's)
    target: str = ""
    flags: str = ""
    target_max_abs: float | None = None


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

    @classmethod
    def out_of_memory(cls, cell_id: str, stage: str, used: int, limit: int, source: str,
                      seconds: float = 0.0, restarted: bool = False) -> CellResult:
        """The result of a cell stopped for memory: one ``out-of-memory`` row on the stage
        that was running (``stage``), with the bytes seen, the limit and where it comes
        from. ``restarted``: the Dask nanny restarted the worker (the cell was not
        watched down to its own process tree, or the worker itself grew)."""
        gib = 2**30
        who = ("the Dask worker running it passed its memory limit and its nanny restarted "
               "it" if restarted else "its processes (the cell, its native worker, pnnx) "
               "passed the memory limit and were stopped")
        msg = (f"out of memory in stage {stage!r}: {who}: {used / gib:.3g} GiB used, "
               f"limit {limit / gib:.3g} GiB ({source})")
        hint = ("give the cell more memory (a larger memory_limit for the Dask workers, "
                "fewer threads per worker so fewer cells share it, or sweep(memory_limit=) "
                "locally), or a smaller model or input; the other cells ran on")
        if restarted:
            hint += ("; without shared= a cell's folder comes back through the worker's "
                     "memory: pass shared= (a folder every worker can write) for big models")
        return cls(cell_id, [StageResult(stage, "out-of-memory", "NotEnoughMemory", msg, hint,
                                         seconds=seconds)], seconds=seconds)


def run_cell(cell: Cell, folder: Path) -> CellResult:
    """Run every stage of ``cell`` with its artifacts in ``folder`` (a Workspace)."""
    t0 = time.perf_counter()
    run = _CellRun(cell, folder)
    built = run.stage("model", lambda: model_and_inputs(cell.model))
    if built is not None:
        run.model, run.inputs = built
        run.onnx_stages()
        run.ncnn_stage()
        run.int8_stages()
    runners = run.ncnn_on_target()
    run.compare(runners)
    run.mark_not_run()
    return CellResult(cell.id, [run.out[s] for s in STAGES], run.ops,
                      seconds=round(time.perf_counter() - t0, 3))


class _CellRun:
    """One cell's stages, run in order: each stage's row in ``out``, its artifact in
    ``arts``; a stage's failure is its row, never the cell's end."""

    def __init__(self, cell: Cell, folder: Path) -> None:
        self.cell, self.folder, self.opts = cell, folder, cell.options
        self.tools = tool_versions()
        self.ws = Workspace(folder)
        self.out: dict[str, StageResult] = {}
        self.arts: dict[str, Any] = {}
        self.ops: list[OpPoint] = []
        self.model: Any = None
        self.inputs: Any = None

    def stage(self, stage: str, fn: Any) -> Any:
        """``fn()`` as ``stage``: its row (ok, or why it failed), timed."""
        t = time.perf_counter()
        with contextlib.suppress(OSError):  # which stage runs, if the cell is stopped in it
            (self.folder / RUNNING).write_text(stage)
        try:
            value = fn()
        except Exception as e:  # every stage's failure is this cell's record, never fatal
            self.out[stage] = _failed(stage, e, self.folder)
            value = None
        else:
            self.out[stage] = _from_artifact(stage, value, self.folder) if hasattr(
                value, "graph") else StageResult(stage, "ok")
        self.out[stage].seconds = round(time.perf_counter() - t, 3)
        self.out[stage].tools = self.tools
        return value

    @property
    def onnx_stage(self) -> str | None:
        """The last ONNX stage that made an artifact (raise, simplify, export)."""
        return next((s for s in ("raise", "simplify", "export")
                     if self.arts.get(s) is not None), None)

    def onnx_stages(self) -> None:
        opts, arts, ws = self.opts, self.arts, self.ws
        exp = {"exporter": opts["exporter"]} | ({"opset": opts["opset"]} if opts["opset"] else {})
        arts["export"] = self.stage("export", lambda: export(self.model, self.inputs,
                                                             workspace=ws, **exp))
        if arts["export"] is None:
            return
        if opts["simplify"] != "none":
            arts["simplify"] = self.stage("simplify", lambda: simplify(
                arts["export"], backend=opts["simplify"], workspace=ws))
        if opts["raise"]:
            parent = arts.get("simplify") or arts["export"]
            arts["raise"] = self.stage("raise", lambda: raise_ops(parent, workspace=ws))

    def ncnn_stage(self) -> None:
        if self.opts["ncnn"] != "none":
            self.arts["ncnn"] = self.stage("ncnn", lambda: to_ncnn(
                self.model, self.inputs, workspace=self.ws,
                fp16=self.opts["ncnn"] in FP16_WEIGHTS))

    def int8_stages(self) -> None:
        precision, arts, onnx_stage = self.opts["precision"], self.arts, self.onnx_stage
        if precision == "fp32":
            return
        samples = calibration_samples(self.inputs)
        if precision in ("int8", "int8-onnxruntime") and onnx_stage:
            arts["ort-int8"] = self.stage("ort-int8", lambda: quantize(
                arts[onnx_stage], as_declared(samples, arts[onnx_stage]),
                backend="onnxruntime", workspace=self.ws, progress=False))
        if precision in ("int8", "int8-ncnn") and self.opts["ncnn"] in FP16_WEIGHTS:
            self.out["ncnn-int8"] = StageResult(
                "ncnn-int8", "off", hint="ncnn int8 is made from the fp32 model: the cell "
                "with ncnn=fp32 has it", tools=self.tools)
        elif precision in ("int8", "int8-ncnn") and arts.get("ncnn") is not None:
            arts["ncnn-int8"] = self.stage("ncnn-int8", lambda: quantize(
                arts["ncnn"], as_declared(samples, arts["ncnn"]), backend="ncnn",
                workspace=self.ws, progress=False))
        for stage in INT8_STAGES:
            if arts.get(stage) is not None:
                _judge_int8(self.out[stage], arts[stage])

    def ncnn_on_target(self) -> dict[str, Any]:
        """The ncnn candidates as runners on the cell's target (None: this machine), each
        row recording where it ran and the flags that ran; on a target, the output check
        there too."""
        target, out = self.opts["target"], self.out
        runners = ncnn_runners(self.arts, self.opts, out, lambda stage, e: _mark_failed(
            out[stage], e, self.folder))
        if target is not None and "ncnn" in runners and out["ncnn"].status == "ok":
            try:
                check_on_target(out["ncnn"], self.arts["ncnn"], self.model, self.inputs,
                                target, run_precision(self.opts["ncnn"], target))
            except Exception as e:  # the row says why (a crash there is the comparison's too)
                _mark_failed(out["ncnn"], e, self.folder)
        return runners

    def compare(self, runners: dict[str, Any]) -> None:
        """Every candidate compared with the tolerance of its precision: one comparison per
        precision present (the ONNX stages fp32, ncnn its weights', int8 its own)."""
        onnx_stage, arts = self.onnx_stage, self.arts
        of: dict[str, str] = {onnx_stage or "": "fp32",
                              "ncnn": "fp16" if self.opts["ncnn"] in FP16_WEIGHTS else "fp32",
                              "ort-int8": "int8", "ncnn-int8": "int8"}
        compared = [s for s in (onnx_stage, "ncnn", *INT8_STAGES)
                    if s and arts.get(s) is not None
                    and (s in runners or s not in NCNN_STAGES)]  # a runner refused: not compared
        cands = [(s, runners.get(s, arts[s]), of[s]) for s in compared]
        if not cands:
            return
        groups = {p: [(s, a) for s, a, q in cands if q == p] for _, _, p in cands}

        def compare_all() -> list[tuple[str, list[tuple[str, Any]], Any]]:
            return [(p, group, compare(self.model, [a for _, a in group], self.inputs,
                                       tolerance=Tolerance(*for_precision(p)), progress=False))
                    for p, group in groups.items()]

        reps = self.stage("compare", compare_all)
        if reps is not None:
            _record_comparisons(reps, self.out, self.ops)

    def mark_not_run(self) -> None:
        """What did not run: not chosen ("off"), or an earlier stage failed ("skipped")."""
        opts, precision = self.opts, self.opts["precision"]
        for stage in STAGES:
            if stage in self.out:
                continue
            chosen = not ((stage == "simplify" and opts["simplify"] == "none")
                          or (stage == "raise" and not opts["raise"])
                          or (stage == "ncnn" and opts["ncnn"] == "none")
                          or (stage == "ort-int8" and precision not in ("int8",
                                                                        "int8-onnxruntime"))
                          or (stage == "ncnn-int8" and (precision not in ("int8", "int8-ncnn")
                                                        or opts["ncnn"] == "none")))
            self.out[stage] = StageResult(stage, "skipped" if chosen else "off",
                                          tools=self.tools)


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


def _mark_failed(row: StageResult, e: BaseException, folder: Path) -> None:
    """``row`` (a stage that made its artifact) failed afterwards, by ``e``: its status and
    error as ``_failed`` gives them, its figures kept."""
    f = _failed(row.stage, e, folder)
    row.status, row.error_class, row.error, row.hint = f.status, f.error_class, f.error, f.hint


def _record_comparisons(reps: list[tuple[str, list[tuple[str, Any]], Any]],
                        out: dict[str, StageResult], ops: list[OpPoint]) -> None:
    """Each comparison's verdicts onto the compare row, and each candidate's tolerance,
    aligned fraction and first divergence onto the row of the stage that made it. An int8
    candidate's bar is its SNR (``_judge_int8``); its comparison says where the error grows."""
    row = out["compare"]
    failed = []
    tolerances = set()
    for precision, cands, rep in reps:
        names = [c.name for c in rep.candidates]
        stage_of = {name: stage for (stage, _), name in zip(cands, names, strict=False)}
        fractions = rep.aligned_fraction
        divergences = rep.divergences()
        tol = rep.tolerance
        tolerances.add((tol.atol, tol.rtol))
        for (stage, _), name in zip(cands, names, strict=False):
            cand_row = out[stage]
            cand_row.atol, cand_row.rtol = float(tol.atol), float(tol.rtol)
            cand_row.aligned_fraction = _num(fractions.get(name))
            div = divergences.get(name)
            if div is not None:
                cand_row.first_divergence = (f"{div.reference} ({div.op_type} {div.name}, "
                                             f"max abs {div.metrics.max_abs:.3g})")
        verdicts = rep.verdicts()
        if precision != "int8" and any(not v.ok for v in verdicts.values()):
            failed.append(f"{precision} (atol {tol.atol:g}, rtol {tol.rtol:g}): "
                          f"{rep.summary()}")
        for r in rep.records:
            if r.mode == "accumulated":
                ops.append(OpPoint(stage_of.get(r.candidate, r.candidate), int(r.order),
                                   r.reference, r.op_type, _num(r.metrics.max_abs),
                                   bool(r.metrics.passed)))
    if len(tolerances) == 1:
        row.atol, row.rtol = map(float, tolerances.pop())
    if failed:
        row.status = "mismatch"
        row.error_class = "tolerance"
        row.error = "\n".join(failed)
        row.hint = "open the comparison: wb.compare(model, [...], inputs).table(), or the " \
                   "first divergence's repro (rep.repro)"


def _judge_int8(row: StageResult, art: Any) -> None:
    """An int8 row is ok when its output SNR vs its float parent (the quantize stage's own
    check, on the example inputs) reaches INT8_MIN_SNR_DB."""

    row.snr_db = _num(art.metrics.get("min_snr_db_vs_parent"))
    row.min_snr_db = INT8_MIN_SNR_DB
    if row.status == "ok" and (row.snr_db is None or row.snr_db < INT8_MIN_SNR_DB):
        shown = "no finite figure" if row.snr_db is None else f"{row.snr_db:.1f} dB"
        row.status = "mismatch"
        row.error_class = "snr"
        row.error = (f"int8 output SNR vs the float model: {shown}, below "
                     f"{INT8_MIN_SNR_DB:g} dB")
        row.hint = ("find the layers that cost most and keep them in float: "
                    "rep = wb.compare(model, [float_art, int8_art], inputs); "
                    "wb.quantize(float_art, samples, exclude=rep.sensitive(3))")


def as_declared(samples: list[tuple[Any, ...]], art: Any) -> list[tuple[Any, ...]]:
    """``samples`` in the integer or float width ``art``'s graph declares for each input
    (quantize checks samples against it, ncnn too); other kinds are left for quantize to
    refuse."""
    import numpy as np

    specs = list(art.graph.inputs)
    if not samples or len(specs) != len(samples[0]):
        return samples

    def fit(a: Any, dtype: str) -> Any:
        try:
            want = np.dtype(dtype)
        except TypeError:
            return a
        same_kind = {a.dtype.kind, want.kind} <= set("iu") or {a.dtype.kind, want.kind} == {"f"}
        return a.astype(want) if same_kind and a.dtype != want else a

    return [tuple(fit(np.asarray(a), t.dtype) for a, t in zip(s, specs, strict=True))
            for s in samples]


def calibration_samples(inputs: tuple, n: int = CALIBRATION_SAMPLES, seed: int = 0
                        ) -> list[tuple[Any, ...]]:
    """``n`` calibration samples: the example inputs first, then seeded ones like them (with
    fewer than 8 the quantize stage holds none out: its SNR is measured on the example
    inputs, which calibrated too; a cell's verdict is the comparison's, not that figure): floats uniform over each input's range,
    integers (token ids) drawn from theirs, others repeated."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    first = tuple(t.detach().cpu().numpy() for t in inputs)
    out = [first]
    for _ in range(n - 1):
        sample = []
        for t in inputs:
            t = t.detach().cpu()
            if t.dtype.is_floating_point and t.numel():
                lo, hi = float(t.min()), float(t.max())
                x = torch.rand(t.shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
                sample.append(x.to(t.dtype).numpy())
            elif t.dtype in (torch.int32, torch.int64) and t.numel():
                sample.append(torch.randint(int(t.min()), int(t.max()) + 1, t.shape,
                                            generator=gen, dtype=t.dtype).numpy())
            else:
                sample.append(t.numpy().copy())
        out.append(tuple(sample))
    return out


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def main(argv: list[str]) -> int:
    """``python -m workbench.sweeps.cell SPEC.json``: SPEC holds the cell, its folder and where
    to write the result (atomically: a reader sees the whole result or none)."""

    spec = json.loads(Path(argv[0]).read_text())
    _stop_with_parent(spec.get("parent"))
    cell = Cell(spec["model"], spec["name"], tuple((k, v) for k, v in spec["choices"]))
    folder = Path(spec["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    result = run_cell(cell, folder)
    atomic_write_text(Path(spec["result"]), result.to_json())
    (folder / RUNNING).unlink(missing_ok=True)
    return 0


def _stop_with_parent(parent: int | None, interval: float = 1.0) -> None:
    """A cell whose sweep is gone (SIGKILLed, or its Dask worker lost) stops too, with what it
    started: nobody would store its result, and a rerun of the sweep writes the same folder.
    ``parent`` is the pid the sweep wrote in the spec (it may have died before this line).
    Only in a process group of its own (as the sweep starts cells): never a shell's group."""
    import os
    import signal
    import threading

    if os.getpgrp() != os.getpid():
        return
    parent = parent or os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:  # re-parented: the sweep died
                os.killpg(0, signal.SIGKILL)
            time.sleep(interval)

    threading.Thread(target=watch, name="wb-cell-parent", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
