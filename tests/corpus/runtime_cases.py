"""Odd inputs to every runner, killed and stalled workers, the process killed mid-stage.

Inputs: each variant goes to OrtRunner (tiny.onnx, static 1x3x16x16), NcnnRunner (tiny ncnn)
and TorchRunner (the torch net); what is right is the torch net's output on the same values
as float32 (where the runner accepts the input), or a hinted refusal. Workers: the runner's
worker (``runner.worker_pid``) gets a signal before or during a run; BackendCrashed or
BackendTimeout is right, and the next run must work. Mid-stage kills: a stage runs in a forked
process that is SIGKILLed after a delay; reopening the workspace must keep every artifact and
the stage, run again, must give a correct result.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .actions import Action, Context, close, first
from .base import tiny_net
from .harness import Case


def _bf16(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(x).to(torch.bfloat16)


def _grad(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(x.copy()).requires_grad_(True)


def _meta(x: np.ndarray) -> Any:
    import torch

    return torch.empty(x.shape, device="meta")


def _with(x: np.ndarray, value: float, where: Any = (0, 0, 5, 5)) -> np.ndarray:
    y = x.copy()
    y[where] = value
    return y


def _strided(x: np.ndarray) -> np.ndarray:
    big = np.zeros((1, 3, 32, 32), np.float32)
    big[:, :, ::2, ::2] = x
    return big[:, :, ::2, ::2]


# variant -> (make input from x, expect, torch truth possible on float32 values)
VARIANTS: dict[str, tuple[Callable[[np.ndarray], Any], str]] = {
    "float64": (lambda x: x.astype(np.float64), "either"),
    "float16": (lambda x: x.astype(np.float16), "either"),
    "bfloat16": (_bf16, "either"),
    "int64": (lambda x: (x * 3).astype(np.int64), "either"),
    "int32": (lambda x: (x * 3).astype(np.int32), "either"),
    "uint8": (lambda x: (np.abs(x) * 40).astype(np.uint8), "either"),
    "bool": (lambda x: x > 0, "either"),
    "object": (lambda x: x.astype(object), "either"),
    "strings": (lambda x: np.full(x.shape, "a"), "error"),
    "complex": (lambda x: x.astype(np.complex64), "error"),
    "empty_h": (lambda x: x[:, :, :0], "error"),
    "empty_batch": (lambda x: x[:0], "either"),
    "nan_one": (lambda x: _with(x, np.nan), "ok"),
    "inf_one": (lambda x: _with(x, np.inf), "ok"),
    "all_nan": (lambda x: np.full_like(x, np.nan), "ok"),
    "huge_values": (lambda x: x * np.float32(1e30), "ok"),
    "rank3": (lambda x: x[0], "either"),
    "rank5": (lambda x: x[None], "error"),
    "rank1": (lambda x: x.reshape(-1), "error"),
    "channels4": (lambda x: np.concatenate([x, x[:, :1]], axis=1), "error"),
    "channels1": (lambda x: x[:, :1], "error"),
    "batch2": (lambda x: np.concatenate([x, x]), "either"),
    "spatial17": (lambda x: np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1))), "either"),
    "fortran_order": (np.asfortranarray, "ok"),
    "strided_view": (_strided, "ok"),
    "negative_strides": (lambda x: x[..., ::-1][..., ::-1], "ok"),
    "nested_list": (lambda x: x.tolist(), "either"),
    "requires_grad": (_grad, "ok"),
    "meta_tensor": (_meta, "error"),
    "none": (lambda x: None, "error"),
    "scalar": (lambda x: 1.0, "error"),
    "wrong_name": (lambda x: {"nope": x}, "error"),
    "empty_dict": (lambda x: {}, "error"),
    "two_positional": (lambda x: (x, x), "error"),
}
NONFINITE = {"nan_one", "inf_one", "all_nan"}
# fixed-shape ONNX export: another shape must be refused, not run
ORT_ERROR = {"rank3", "batch2", "spatial17", "empty_batch"}


def _truth(inp: Any) -> np.ndarray | None:
    import torch

    try:
        if isinstance(inp, torch.Tensor):
            t = inp.detach().float()
        else:
            t = torch.from_numpy(np.asarray(inp).astype(np.float32))
        with torch.no_grad():
            return tiny_net(_SEED[0])(t).numpy()
    except Exception:  # noqa: BLE001 - torch cannot run it: only a refusal is right
        return None


_SEED = [0]


def _runner(kind: str, ctx: Context) -> Any:
    from workbench.runtime import NcnnRunner, OrtRunner, TorchRunner

    if kind == "ort":
        return OrtRunner(ctx.model("tiny.onnx"))
    if kind == "ncnn":
        return NcnnRunner(ctx.model("tiny.ncnn.param"))
    return TorchRunner(tiny_net(ctx.index["seed"]))


def _input(ctx: Context) -> Action:
    _SEED[0] = ctx.index["seed"]
    x, _ = ctx.ref("tiny")
    inp = VARIANTS[ctx.p["variant"]][0](x)

    def act() -> tuple[str, str]:
        runner = _runner(ctx.p["runner"], ctx)
        feed = inp if isinstance(inp, (dict, tuple)) else (inp,)
        out = first(runner.run(feed))
        truth = _truth(inp)
        if truth is None:
            return "wrong", f"returned {np.asarray(out).shape} for an input torch refuses"
        if ctx.p["variant"] in NONFINITE:  # NaN handling is the backend's: finite values
            out = np.asarray(out, dtype=np.float64)  # must match, and the shape
            if out.shape == truth.shape and np.isfinite(truth).any():
                keep = np.isfinite(truth)
                return close(out[keep], truth[keep], atol=1e-3, what="finite outputs")
            if out.shape == truth.shape:
                return "ok", "all outputs non-finite in torch; the shape matches"
        return close(out, truth, atol=1e-3, what=f"{ctx.p['runner']} output")
    return act


def _compare_input(ctx: Context) -> Action:
    import workbench as wb

    _SEED[0] = ctx.index["seed"]
    x, _ = ctx.ref("tiny")
    inp = VARIANTS[ctx.p["variant"]][0](x)

    def act() -> tuple[str, str]:
        rep = wb.compare(tiny_net(ctx.index["seed"]), [ctx.model("tiny.onnx")], (inp,),
                         progress=False)
        text = rep.summary()
        frac = min(rep.aligned_fraction.values()) if rep.aligned_fraction else 0.0
        if _truth(inp) is None:
            return "wrong", f"compare ran on an input torch refuses: {text[:200]}"
        return ("ok" if frac > 0 else "wrong"), f"aligned {frac:.2f}: {text[:200]}"
    return act


# -- workers --------------------------------------------------------------------------------
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "TERM": signal.SIGTERM,
           "SEGV": signal.SIGSEGV, "ABRT": signal.SIGABRT, "INT": signal.SIGINT}


def _worker(ctx: Context) -> Action:
    from workbench.runtime import NcnnRunner, OrtRunner

    backend, sig, when = ctx.p["backend"], SIGNALS.get(ctx.p["signal"]), ctx.p["when"]
    x, y = ctx.ref("tiny")

    def small() -> tuple[Any, Callable[[], tuple[str, str]]]:
        if backend == "ncnn":
            r = NcnnRunner(ctx.model("tiny.ncnn.param"))
            return r, lambda: close(first(r.run((x,))), y, atol=1e-3, what="ncnn output")
        r = OrtRunner(ctx.model("tiny.onnx"))
        return r, lambda: close(first(r.run({"input": x})), y, what="ort output")

    def act() -> tuple[str, str]:
        if when == "before":
            r, check = small()
            check()  # the worker is up
            os.kill(r.worker_pid, sig)
            time.sleep(0.3)
            return check()
        slow = OrtRunner(ctx.model("slow.onnx"), timeout=ctx.p.get("timeout"))
        slow.run({"x": np.ones((1, 1024), np.float32)})  # worker up, session made
        pid = slow.worker_pid
        if sig is not None:
            threading.Timer(ctx.p["delay"], os.kill, (pid, sig)).start()
        try:
            slow.run({"x": np.ones((1024, 1024), np.float32)})
        except Exception as first_error:  # noqa: BLE001 - checked for recovery, then re-raised
            r, check = small()
            verdict, detail = check()
            if verdict != "ok":
                raise RuntimeError(f"no recovery after {first_error!r}: {detail}") from None
            raise
        return "wrong", "the run finished although its worker was signalled or past timeout"
    return act


def _shm_removed(ctx: Context) -> Action:
    import shutil

    from workbench.runtime import OrtRunner
    from workbench.runtime.worker import worker

    x, y = ctx.ref("tiny")

    def act() -> tuple[str, str]:
        r = OrtRunner(ctx.model("tiny.onnx"))
        r.run({"input": x})
        shutil.rmtree(worker().dir)
        if ctx.p["new_runner"]:
            r = OrtRunner(ctx.model("tiny.onnx"))
        return close(first(r.run({"input": x})), y, what="ort output")
    return act


# -- the process killed mid-stage -----------------------------------------------------------
def _stage(name: str, ctx: Context) -> Callable[[], tuple[str, str]]:
    import torch

    import workbench as wb
    from workbench.runtime import NcnnRunner, OrtRunner

    x, y = ctx.ref("tiny")
    onx = ctx.ws_artifact_path("onnx_id")

    def run() -> tuple[str, str]:
        if name == "export":
            art = wb.export(tiny_net(ctx.index["seed"]), (torch.from_numpy(x),),
                            workspace=ctx.ws_path, input_names=["input"])
        elif name == "import":
            art = wb.Workspace(ctx.ws_path).import_file(ctx.model("tiny.onnx"))
        elif name == "simplify":
            art = wb.simplify(wb.Workspace(ctx.ws_path).get(ctx.index["onnx_id"]))
        elif name == "raise":
            art = wb.raise_ops(wb.Workspace(ctx.ws_path).get(ctx.index["onnx_id"]))
        else:
            art = wb.to_ncnn(onx, (torch.from_numpy(x),), workspace=ctx.ws_path)
            return close(first(NcnnRunner(art).run((x,))), y, atol=1e-3, what="ncnn output")
        return close(first(OrtRunner(art).run({"input": x})), y, what=f"{name} output")
    return run


def _kill_stage(ctx: Context) -> Action:
    def act() -> tuple[str, str]:
        import warnings

        import workbench as wb

        run = _stage(ctx.p["stage"], ctx)
        pid = os.fork()
        if pid == 0:  # the stage, to be killed
            try:
                run()
            finally:
                os._exit(0)
        time.sleep(ctx.p["delay"])
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ws = wb.Workspace(ctx.ws_path)
        missing = [i for i in ctx.index["artifacts"] if i not in {a.id for a in ws.artifacts}]
        if missing or ws.verify():
            return "wrong", f"after the kill: missing {missing}, verify {ws.verify()}"
        left = [p.name for p in ctx.ws_path.glob(".staging-*")]
        if left:
            return "wrong", f"staging left after reopen: {left}"
        return run()
    return act


KINDS = {"input": _input, "compare_input": _compare_input, "worker": _worker,
         "shm_removed": _shm_removed, "kill_stage": _kill_stage}


def cases(rng: np.random.Generator) -> list[Case]:
    out: list[Case] = []
    for variant, (_, expect) in VARIANTS.items():
        for runner in ("ort", "ncnn", "torch"):
            exp = "error" if runner == "ort" and variant in ORT_ERROR else expect
            out.append(Case(f"input-{runner}-{variant}", "input", "input",
                            {"variant": variant, "runner": runner}, expect=exp))
    for variant in ("float64", "bfloat16", "nan_one", "channels4", "rank5", "strings"):
        out.append(Case(f"input-compare-{variant}", "input", "compare_input",
                        {"variant": variant}, expect=VARIANTS[variant][1], timeout=90))
    for backend in ("ort", "ncnn"):
        for sig in SIGNALS:
            out.append(Case(f"worker-{backend}-{sig}-before", "worker", "worker",
                            {"backend": backend, "signal": sig, "when": "before"},
                            expect="either"))
    for sig in ("KILL", "STOP", "SEGV", "TERM"):
        for delay in (0.2, 0.8):
            out.append(Case(f"worker-ort-{sig}-during-{delay}", "worker", "worker",
                            {"backend": "ort", "signal": sig, "when": "during",
                             "delay": delay}))
    for t in (0.3, 1.0):
        out.append(Case(f"worker-ort-timeout-{t}", "worker", "worker",
                        {"backend": "ort", "signal": "none", "when": "during", "timeout": t}))
    for new in (False, True):
        out.append(Case(f"worker-shm-removed-{'new' if new else 'same'}-runner", "worker",
                        "shm_removed", {"new_runner": new}, expect="ok"))
    # delays spread over each stage's usual duration (seconds, on this machine)
    for stage, dur in (("import", 0.4), ("export", 3.0), ("simplify", 3.0), ("raise", 3.0),
                       ("to_ncnn", 4.0)):
        delays = sorted({round(float(d), 2) for d in rng.uniform(0.02, dur, 4)})
        for d in delays:
            out.append(Case(f"kill_stage-{stage}-{d}", "kill_stage", "kill_stage",
                            {"stage": stage, "delay": d}, expect="ok", timeout=150))
    return out
