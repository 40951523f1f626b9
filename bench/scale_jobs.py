"""One measured job of ``bench/scale.py``, run in a fresh child process
(``scale.py --child JSON``): the workbench's stage ("wb") or the bare tool doing the same
job ("bare"), on a model built here from its seed.

The child builds the model and its inputs, imports the libraries both sides use (torch,
transformers, onnx, onnxruntime, onnxslim, ncnn, workbench), opens the artifacts the job
reads, reads their files once (``warm_inputs``: the job starts with them in the page cache,
whichever side runs first), collects garbage, resets its VmHWM (``/proc/self/clear_refs``)
and prints the start marker; the parent samples the process tree from then until the done
marker, which carries the job's seconds (measured here) and what it wrote. The worker the
workbench starts, and pnnx, are children of this process and count in the tree.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START, DONE = "SCALE-START ", "SCALE-DONE "


def build(spec: dict[str, Any]) -> tuple[Any, tuple]:
    """The seeded model of ``spec`` (the same bytes in every child)."""
    from scale_models import decoder, wide_cnn

    if spec["model"] == "cnn":
        return wide_cnn()
    return decoder(spec["layers"], tokens=spec["tokens"], small=spec["small"])


def _preimport() -> None:
    """What both sides may use, imported before the start: the stage pays for its own work,
    not for a library's first import (the workbench's own modules import during the stage)."""
    import ncnn  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxslim  # noqa: F401
    import torch.onnx  # noqa: F401

    import workbench  # noqa: F401


def _source(ref: dict[str, Any], ws: Any) -> Any:
    """An artifact of the workspace (``{"id": ...}``) or a path (``{"path": ...}``)."""
    return ws.get(ref["id"]) if ref.get("id") else ref["path"]


def _art(a: Any) -> dict[str, Any]:
    return {"id": a.id, "path": str(a.path), "dir": str(a.dir)}


# -- the jobs: each returns (a thunk run between the markers) ----------------------------------
def _wb(spec: dict[str, Any], model: Any, x: tuple) -> Any:
    import workbench as wb

    ws = wb.Workspace(spec["workspace"])
    stage, inp = spec["stage"], spec.get("inputs", {})
    if stage == "export":
        return lambda: _art(wb.export(model, x, workspace=ws))
    if stage == "simplify":
        src = _source(inp["onnx"], ws)
        return lambda: _art(wb.simplify(src, workspace=ws))
    if stage == "to_ncnn":
        src = _source(inp["onnx"], ws)  # a path (the bare file) carries no example inputs
        return lambda: _art(wb.to_ncnn(src, None if inp["onnx"].get("id") else x,
                                       workspace=ws))
    if stage == "compare":
        cands = [_source(c, ws) for c in inp["candidates"]]

        def run() -> dict[str, Any]:
            rep = wb.compare(model, cands, x, mode="accumulated", progress=False)
            return {"aligned": {k: round(v, 4) for k, v in rep.aligned_fraction.items()},
                    "summary": rep.summary()[:300]}
        return run
    raise ValueError(stage)


def _bare(spec: dict[str, Any], model: Any, x: tuple) -> Any:
    stage, inp, out = spec["stage"], spec.get("inputs", {}), Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    if stage == "export":
        return lambda: bare_export(model, x, out / "model.onnx")
    if stage == "simplify":
        return lambda: bare_simplify(inp["onnx"]["path"], out / "model.onnx")
    if stage == "to_ncnn":
        return lambda: bare_pnnx(inp["onnx"]["path"], x, out)
    if stage == "compare":
        return plain_runs(model, x, [c["path"] for c in inp["candidates"]])
    raise ValueError(stage)


def bare_export(model: Any, x: tuple, path: Path) -> dict[str, Any]:
    """``torch.onnx.export`` (TorchScript, opset 17, constant folding: what wb.export asks
    of it), with the workbench's shipped rewriters applied as wb.export applies them: the
    decoder's ``torch.diff`` (transformers' masks) has no TorchScript conversion, so the
    bare exporter fails without ``workbench.diff`` (stages/rewriters_builtin.py)."""
    import torch

    from workbench.stages.rewrite_session import choose
    from workbench.stages.rewriters import RewriteContext

    plan = choose(RewriteContext("export", "onnxruntime", "torchscript", 17))
    with plan.applied(), torch.no_grad():
        torch.onnx.export(model, x, str(path), dynamo=False, opset_version=17,
                          do_constant_folding=True)
    return {"path": str(path), "rewriters": sorted(plan.calls)}


def bare_simplify(src: str, path: Path) -> dict[str, Any]:
    """``onnxslim.slim`` (wb.simplify's default backend), file to file."""
    import onnxslim

    onnxslim.slim(src, str(path))
    return {"path": str(path)}


def bare_pnnx(src: str, x: tuple, out: Path) -> dict[str, Any]:
    """The pnnx binary on ``src`` with the command wb.to_ncnn builds
    (stages/pnnx_command.py: inputshape from the inputs, device=cpu, optlevel=2, fp16=0), in
    a folder holding links to the model and its external data, OMP_NUM_THREADS=2 as
    stages/pnnx_run.py sets it."""
    from workbench.stages.pnnx_command import pnnx_command

    srcp = Path(src)
    for f in srcp.parent.iterdir():  # the model and any external data beside it
        if f.name == srcp.name or f.name.startswith(srcp.name + ".") or f.suffix == ".data":
            link = out / ("model.onnx" if f.name == srcp.name else f.name)
            if not link.exists():
                link.symlink_to(f.resolve())
    cmd = pnnx_command(out / "model.onnx", x, None, optlevel=2, fp16=False, moduleop=[])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    with open(out / "pnnx.log", "wb") as log:
        rc = subprocess.run(cmd, cwd=out, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (out / "pnnx.log").read_text(errors="replace").splitlines()[-8:]
        raise RuntimeError(f"pnnx exited {rc}: " + " | ".join(tail))
    return {"param": str(out / "model.ncnn.param"), "path": str(out / "model.ncnn.param")}


def plain_runs(model: Any, x: tuple, candidates: list[str]) -> Any:
    """The runs wb.compare stands beside: torch's forward, then per candidate an ONNX Runtime
    session (CPU, default options) created and run once, or an ncnn net (fp32, as the
    workbench's runner sets it) loaded and run once; all in this process, all kept alive to
    the end (as compare keeps its runners). Times: each creation and run apart."""
    import numpy as np
    import torch

    def run() -> dict[str, Any]:
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        with torch.no_grad():
            model(*x)
        t["torch run"] = time.perf_counter() - t0
        held = []
        for i, c in enumerate(candidates):
            if c.endswith(".onnx"):
                held.append(_ort(c, x, t, f"ort{i}", np))
            else:
                held.append(_ncnn(c, x, t, f"ncnn{i}", np))
        runs = sum(v for k, v in t.items() if k.endswith("run"))
        return {"times": {k: round(v, 3) for k, v in t.items()}, "runs_s": round(runs, 3)}
    return run


def _ort(path: str, x: tuple, t: dict[str, float], key: str, np: Any) -> Any:
    import onnxruntime as ort

    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    t[f"{key} create"] = time.perf_counter() - t0
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), x, strict=True)}
    t0 = time.perf_counter()
    sess.run(None, feed)
    t[f"{key} run"] = time.perf_counter() - t0
    return sess


def _ncnn(param: str, x: tuple, t: dict[str, float], key: str, np: Any) -> Any:
    """As pnnx's ``model_ncnn.py`` feeds it: in0.. with ``batch_index=0``, integers as int32;
    every outN extracted."""
    import ncnn

    from workbench.runtime.ncnn_flags import options

    t0 = time.perf_counter()
    net = ncnn.Net()
    for flag, on in options("fp32").items():
        setattr(net.opt, flag, on)
    net.load_param(param)
    net.load_model(param[: -len(".param")] + ".bin")
    t[f"{key} create"] = time.perf_counter() - t0
    arrays = [np.ascontiguousarray(a.numpy().astype(
        np.int32 if a.dtype.is_floating_point is False else np.float32)) for a in x]
    outs = [b.name for b in net.blobs() if re.fullmatch(r"out\d+", b.name)]
    t0 = time.perf_counter()
    ex = net.create_extractor()
    for i, a in enumerate(arrays):
        ex.input(f"in{i}", ncnn.Mat(a, batch_index=0).clone())
    for name in outs:
        ret, mat = ex.extract(name)
        if ret != 0:
            raise RuntimeError(f"ncnn extract({name!r}) returned {ret}")
        np.array(mat)
    t[f"{key} run"] = time.perf_counter() - t0
    return net


def input_files(spec: dict[str, Any]) -> list[Path]:
    """The files the job reads: those of each input's folder (a model and its weights)."""
    refs = spec.get("inputs", {})
    paths = [refs["onnx"]["path"]] if "onnx" in refs else [
        c["path"] for c in refs.get("candidates", [])]
    return sorted({f for p in paths for f in Path(p).parent.iterdir() if f.is_file()})


def warm_inputs(spec: dict[str, Any]) -> int:
    """Each input file read once, so neither side pays for reading it from the disk: the
    simplify jobs before a to_ncnn (~10 GB each at 24 layers) push the simplified model out
    of the page cache, and the first to_ncnn after them, always a wb run, took 78 and 93 s
    against 64-66 s for the next ones. Returns the bytes read."""
    done = 0
    for f in input_files(spec):
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(16 << 20):
                done += len(chunk)
    return done


def child(spec: dict[str, Any]) -> int:  # noqa: RET503 (exits)
    """Run the job ``spec`` between the markers (see the module docstring)."""
    import torch

    model, x = build(spec)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    _preimport()
    job = (_wb if spec["side"] == "wb" else _bare)(spec, model, x)
    shm = _worker_dir() if spec["side"] == "wb" else None
    warm_inputs(spec)
    gc.collect()
    # the earlier jobs' writes (GBs of models) put on disk now: their writeback would
    # otherwise throttle this job's own writes (measured: a 24-layer export 22-35 s)
    os.sync()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    except OSError:
        pass
    print(START + json.dumps({"model_bytes": model_bytes, "pid": os.getpid(), "shm": shm,
                              "threads": torch.get_num_threads()}), flush=True)
    t0 = time.perf_counter()
    result = job()
    seconds = time.perf_counter() - t0
    print(DONE + json.dumps({"seconds": seconds, "result": result}), flush=True)
    from workbench.runtime.worker import existing

    w = existing()
    if w is not None:
        w.close()
    sys.stdout.flush()
    os._exit(0)  # done and the worker closed: no interpreter teardown (seconds for torch)


def _worker_dir() -> str | None:
    """The folder of the worker the stage will use (made now, the process not started), so
    the parent can remove it should it have to kill this child."""
    from workbench.runtime.worker import worker

    return str(getattr(worker(), "dir", "")) or None


if __name__ == "__main__":  # python bench/scale_jobs.py JSON
    sys.exit(child(json.loads(sys.argv[1])))
