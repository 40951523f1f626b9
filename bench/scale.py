"""How the workbench's cost grows with the model: a Qwen2-shaped decoder at 4, 12 and 24
layers (bench/scale_models.py; 24 layers is Qwen2-0.5B's shape, 494M parameters, 1.98 GB)
and a wide CNN for contrast, each stage beside the bare tool doing the same job (issue 34).

Stages, workbench ("wb") vs bare, in this order (a later stage reads what the earlier wrote:
the wb artifacts, or the bare file where the wb stage failed):

- export: ``wb.export(model, x, workspace=ws)`` vs ``torch.onnx.export(model, x, path,
  dynamo=False, opset_version=17, do_constant_folding=True)``. The bare export runs under the
  workbench's own shipped rewriters, installed as wb.export installs them
  (``choose(...).applied()``, stages/rewrite_session.py): the decoder's masks call
  ``torch.diff``, which the TorchScript exporter cannot convert, and the shipped
  ``workbench.diff`` rewriter (stages/rewriters_builtin.py) is what makes it exportable.
  Every shipped rewriter wb.export would apply is applied (the job's result lists those
  that fired); their cost is in both. Without such a repair the bare export writes a
  CumSum on bools that ONNX Runtime and pnnx reject (wb.export repairs it), one reason the
  later stages read the wb files.
- simplify: ``wb.simplify(artifact)`` (its default backend, onnxslim) vs
  ``onnxslim.slim(in_path, out_path)`` on the same file.
- to_ncnn: ``wb.to_ncnn(simplified artifact)`` vs the pnnx binary with the command
  wb.to_ncnn builds (stages/pnnx_command.py: ``inputshape=`` of the inputs, ``device=cpu
  optlevel=2 fp16=0``, OMP_NUM_THREADS=2 as stages/pnnx_run.py sets it), run in a folder of
  links to the same files.
- compare: ``wb.compare(model, [simplified ONNX, ncnn], x, mode="accumulated")`` vs the
  plain runs (scale_jobs.plain_runs): torch's forward (no_grad), an ONNX Runtime session
  (CPU, default options) created and run once, an ncnn net (fp32 options) loaded and run
  once, all in one process and all kept alive to the end. Both are printed: the plain runs
  only ("runs"), and with the session/net creation ("+create"). The time target is judged
  against "+create": wb.compare in a fresh process creates its sessions too.

Each job runs in a fresh child (``--child``, scale_jobs.py) so no peak bleeds into the
next: the child builds the seeded model and its inputs, imports the libraries, opens the
artifacts it reads, writes back what earlier jobs left dirty in the page cache (os.sync:
their gigabytes of writeback otherwise throttled this job's writes), then prints a start
marker; the stage's time is measured in the child
between the markers. The parent samples the child's process tree every 25 ms
(scale_tree.py: the child, the workbench's worker, pnnx; RssAnon + RssFile summed, the
shared /dev/shm transfer files counted once; why not PSS is said there) and keeps the peak
between the markers. The peak includes what was resident at the start (the model itself,
the imports; printed as "start") in both columns. Also printed: the sum of the processes'
own VmHWM (an upper bound) and the plain RSS sum.

Targets (issue 34): wb/bare <= 1.25 in time and in peak memory for export, simplify and
to_ncnn at every decoder size; compare <= 3 in time and <= 1.5 in peak memory, judged on
the largest decoder measured (the issue sets them on the 24-layer one; printed for each
size). The CNN's figures are printed for contrast and not judged (scale_report.py). Then the growth from the smallest to the
largest decoder of each figure, and the end-to-end time of the largest decoder through
export -> simplify -> to_ncnn -> compare (ORT and ncnn candidates).

With ``--repeat N`` each judged job runs N times, wb first then bare first in turn (neither
side always finds the page cache the other left), and the medians are judged: single runs of
the bare tools vary by 20-50% at 24 layers here. Figures printed for contrast run once. A
repeat's files are removed once it is measured, and each model's folder once its stages are
done (``--keep`` keeps them).

Jobs run one at a time (a 24-layer export may peak past 10 GB); each has a timeout scaled
with the layers (``--timeout-scale``), and is stopped when the machine's MemAvailable falls
below ``--memory-floor`` (reported as out of memory: the kernel's OOM killer would pick the
largest process, maybe not ours); a failed, stopped or timed-out job prints why and the
bench goes on. It is a report: the exit status is 0 whatever the figures say.

Run:  cd /work/main && .venv/bin/python bench/scale.py [--layers 4,12,24] [--no-cnn]
      [--quick] [--json PATH] [--keep] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _common import engine_state  # bench/ is on sys.path
from scale_report import not_judged, report
from scale_run import Job, run_job

STAGES = ("export", "simplify", "to_ncnn", "compare")
SIDES = ("wb", "bare")


def timeout_for(layers: int | None, small: bool, scale: float) -> float:
    """Seconds a job may take: generous, growing with the layers."""
    base = 600.0 if layers is None or small else 300.0 + 150.0 * layers
    return base * scale


def _ref(job: Job | None) -> dict[str, Any] | None:
    """What a later stage reads of ``job``'s output: the artifact (wb) or the file."""
    if job is None or not job.ok:
        return None
    r = job.result
    return {"id": r.get("id"), "path": r["path"]} if job.side == "wb" else {"path": r["path"]}


def run_model(name: str, layers: int | None, args: argparse.Namespace, workdir: Path,
              counter: list[int], total: int, decoders: list[str]) -> list[Job]:
    """Every stage of one model, wb then bare (per repeat, the order alternating); a figure
    no target judges (scale_report.not_judged) is run once whatever ``--repeat`` says."""
    mdir = workdir / name
    (mdir / "logs").mkdir(parents=True, exist_ok=True)
    spec = {"model": "cnn" if layers is None else "decoder", "layers": layers,
            "tokens": args.tokens, "small": args.small, "workspace": str(mdir / "ws")}
    jobs: list[Job] = []
    first: dict[tuple[str, str], Job] = {}
    for stage in args.stages:
        inputs = _inputs(stage, first)
        if inputs is None:
            print(f"{name} {stage}: skipped (no input: the earlier stage failed on both sides)")
            continue
        for r, side in runs_of(name, stage, decoders, args.repeat):
            counter[0] += 1
            job = Job(name, layers, stage, side)
            s = dict(spec, stage=stage, side=side, inputs=inputs[side],
                     out=str(mdir / f"bare-{stage}-{r}"))
            log = mdir / "logs" / f"{stage}-{side}-{r}.log"
            run_job(job, s, timeout_for(layers, args.small, args.timeout_scale), log,
                    tag=f"[{counter[0]}/{total}] ",
                    floor_kb=int(args.memory_floor * 1024 * 1024))
            jobs.append(job)
            first.setdefault((stage, side), job)
            if r > 0:  # nothing reads a repeat's files: gone now (a 24-layer to_ncnn: 5 GB)
                _drop_outputs(job, Path(s["workspace"]), Path(s["out"]))
    return jobs


def _drop_outputs(job: Job, ws: Path, bare_out: Path) -> None:
    """A repeated job's files removed: the bare tool's folder, or the workbench's artifact
    folder (and a to_ncnn's pnnx parent). The workspace's manifest then lists them as lost,
    which no later job minds (each opens the workspace by its sidecars)."""
    if job.side == "bare":
        shutil.rmtree(bare_out, ignore_errors=True)
        return
    folder = Path(job.result["dir"]) if job.ok and job.result.get("dir") else None
    if folder is None or folder.parent != ws:
        return
    try:
        parent = json.loads((folder / "artifact.json").read_text()).get("parent")
    except (OSError, ValueError):
        parent = None
    if job.stage == "to_ncnn" and parent:
        shutil.rmtree(ws / parent, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)


def runs_of(model: str, stage: str, decoders: list[str], repeat: int) -> list[tuple[int, str]]:
    """The (run, side) jobs of one stage of ``model``: wb then bare, then bare then wb...
    (neither side always first), ``repeat`` times when a target judges the figure, else
    once."""
    runs = 1 if not_judged(model, stage, decoders) else max(1, repeat)
    return [(r, side) for r in range(runs) for side in (SIDES if r % 2 == 0 else SIDES[::-1])]


def _inputs(stage: str, done: dict[tuple[str, str], Job]) -> dict[str, Any] | None:
    """The inputs of ``stage`` for each side, from the earlier stages' outputs (the wb
    artifact, else the bare file); None when there is nothing to read."""
    def pick(st: str) -> dict[str, Any] | None:
        return _ref(done.get((st, "wb"))) or _ref(done.get((st, "bare")))

    if stage == "export":
        return {"wb": {}, "bare": {}}
    onnx = pick("export") if stage == "simplify" else (pick("simplify") or pick("export"))
    if onnx is None:
        return None
    if stage in ("simplify", "to_ncnn"):
        return {"wb": {"onnx": onnx}, "bare": {"onnx": {"path": onnx["path"]}}}
    cands = [onnx] + ([nc] if (nc := pick("to_ncnn")) else [])
    return {"wb": {"candidates": cands},
            "bare": {"candidates": [{"path": c["path"]} for c in cands]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="4,12,24", help="decoder depths (default 4,12,24)")
    p.add_argument("--cnn", action=argparse.BooleanOptionalAction, default=True,
                   help="the wide CNN too (default on)")
    p.add_argument("--quick", action="store_true", help="--layers 4 (development)")
    p.add_argument("--small", action="store_true", help="the decoders at test widths (tests)")
    p.add_argument("--tokens", type=int, default=64, help="decoder input length (default 64)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each judged job, the wb/bare order alternating (median; "
                        "default 1; a figure printed for contrast runs once)")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="scale every timeout")
    p.add_argument("--stages", default=",".join(STAGES),
                   help=f"a subset of {','.join(STAGES)} (a later one reads the latest earlier "
                        "output: compare without to_ncnn compares the ONNX only)")
    p.add_argument("--memory-floor", type=float, default=1.0, metavar="GB",
                   help="stop a job when the machine's MemAvailable falls below this "
                        "(default 1.0 GB; 0: never), before the OOM killer picks a process")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    p.add_argument("--workdir", help="where the artifacts go (default: a new /tmp folder)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        from scale_jobs import child

        return child(json.loads(args.child))
    asked = [st.strip() for st in args.stages.split(",") if st.strip()]
    if unknown := sorted(set(asked) - set(STAGES)):
        p.error(f"--stages: unknown {unknown}; the stages are {','.join(STAGES)}")
    args.stages = [st for st in STAGES if st in asked]
    layers = [4] if args.quick else sorted({int(v) for v in args.layers.split(",") if v.strip()})
    models: list[tuple[str, int | None]] = [(f"decoder-{n}L", n) for n in layers]
    if args.cnn:
        models.append(("cnn", None))
    args.repeat = max(1, args.repeat)
    decoders = [m for m, n in models if n is not None]
    total = sum(len(runs_of(m, st, decoders, args.repeat)) for m, _ in models for st in args.stages)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="h1_scale-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    jobs: list[Job] = []
    try:
        import workbench

        print(f"{engine_state()}; imported from {Path(workbench.__file__).parent}; "
              f"cores {os.cpu_count()}; load average "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; workdir {workdir}", flush=True)
        for name, n in models:
            try:
                jobs += run_model(name, n, args, workdir, [len(jobs)], total, decoders)
            except Exception:  # the harness broke on this model: say so, go on
                traceback.print_exc()
            if not args.keep:  # its artifacts done with (the three decoders' are 80 GB)
                shutil.rmtree(workdir / name, ignore_errors=True)
        figures = report(jobs, args.repeat)
        print(f"whole run {time.perf_counter() - t_start:.0f} s; load average at the end "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"layers": layers, "cnn": args.cnn, "small": args.small, "tokens": args.tokens,
                 "repeat": args.repeat, "load_end": os.getloadavg(),
                 "jobs": [asdict(j) for j in jobs], **figures}, indent=1, default=str))
            print(f"figures written to {args.json}")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
