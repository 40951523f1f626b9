"""One case of PNNX's ncnn test corpus through the workbench (bench/pnnx_corpus.py's child).

``child_entry`` runs in a process of its own, forked per case from a server that has torch and
the workbench imported already (multiprocessing's forkserver): a fresh process per case without
paying the imports each time. It makes itself a process group (so the driver can kill the case
with its ncnn worker and pnnx on a timeout), sends its stdout and stderr to ``case.log`` in its
scratch folder, and sends its result back as one JSON string.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any


def comparator(source: str) -> dict[str, Any]:
    """How the case's test() compares torch's outputs with ncnn's."""
    if "torch.equal(" in source:
        return {"kind": "equal", "rtol": 0.0, "atol": 0.0, "reshape": "reshape_as" in source}
    tols = [(float(r), float(a)) for r, a in re.findall(
        r"allclose\(\s*\w+\s*,\s*\w+\s*,\s*([0-9.e+-]+)\s*,\s*([0-9.e+-]+)\s*\)", source)]
    rtol, atol = (max(t[0] for t in tols), max(t[1] for t in tols)) if tols else (1e-4, 1e-4)
    return {"kind": "allclose", "rtol": rtol, "atol": atol, "reshape": "reshape_as" in source}


# -- one case, in a child process -----------------------------------------------------------------
class _Traced(Exception):
    """Raised by the patched torch.jit.trace: the test stops once its model is recorded."""


def _flatten(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    return []


def _needs_extra(exc: BaseException) -> str | None:
    text = f"{type(exc).__name__}: {exc}"
    m = re.search(r"No module named '(torchvision|torchaudio)", text)
    return m.group(1) if m else None


def _error(exc: BaseException, stage: str) -> dict[str, Any]:
    from workbench.errors import WorkbenchError

    message = getattr(exc, "message", None) or str(exc)
    hint = getattr(exc, "hint", "") or ""
    lines = [ln for ln in message.splitlines() if ln.strip()]
    return {"stage": stage, "class": type(exc).__name__,
            "workbench_error": isinstance(exc, WorkbenchError),
            "first_line": lines[0] if lines else type(exc).__name__,
            "message": message[-4000:], "hint": hint,
            "cause": pnnx_cause(message)}


def pnnx_cause(message: str) -> str | None:
    """pnnx's own reason, where the error quotes it (a 'not supported' line of its log)."""
    for line in message.splitlines():
        if re.search(r"not supported|unsupported|not implemented|unknown|error", line, re.I) \
                and not line.startswith(("pnnx exited", "pnnx was killed", "command:")):
            return line.strip()[:200]
    return None


def _pnnx_log_reasons(ws: Path) -> list[str]:
    """The 'not supported' lines of every pnnx.log the workspace kept (a pnnx artifact)."""
    reasons: list[str] = []
    for log in ws.rglob("pnnx.log"):
        for line in log.read_text(errors="replace").splitlines():
            line = line.strip()
            if re.search(r"not supported|unsupported", line, re.I) and line not in reasons:
                reasons.append(line[:200])
    return reasons[:5]


def _compare_outputs(ref: list[Any], got: dict[str, Any], how: dict[str, Any]) -> dict[str, Any]:
    """Outputs compared as the case compares them; also whether another order would pass."""
    import numpy as np

    names = list(got)
    vals = [np.asarray(v) for v in got.values()]

    def match(a: Any, b: Any) -> tuple[bool, str]:
        """As the case's test() does: reshape_as where it reshapes, then torch.equal
        (same shape) or torch.allclose (which broadcasts: [] against [1] passes)."""
        shape_note = ""
        if a.shape != b.shape:
            shape_note = f"shape {list(b.shape)} vs torch {list(a.shape)}"
            if how["reshape"] and a.size == b.size:
                b, shape_note = b.reshape(a.shape), ""
            elif how["kind"] == "equal":
                return False, shape_note
            else:
                try:
                    np.broadcast_shapes(a.shape, b.shape)
                except ValueError:  # torch.allclose raises: the test fails
                    return False, shape_note
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if how["kind"] == "equal":
            ok = bool(np.array_equal(a64, b64))
        else:  # torch.allclose(a, b, rtol, atol): |a - b| <= atol + rtol * |b|
            ok = bool(np.allclose(a64, b64, rtol=how["rtol"], atol=how["atol"]))
        diff = float(np.max(np.abs(a64 - b64))) if a64.size and b64.size else 0.0
        return ok, "; ".join(x for x in (shape_note, f"max abs {diff:.3g}") if x)

    detail: list[str] = []
    ok = len(vals) == len(ref)
    if not ok:
        detail.append(f"{len(vals)} outputs {names} vs torch {len(ref)}")
    other_shapes = []
    for k, (a, b) in enumerate(zip(ref, vals, strict=False)):
        good, what = match(a, b)
        if not good:
            ok = False
            detail.append(f"output {k} ({names[k]}): {what}")
        elif a.shape != b.shape:
            other_shapes.append(f"{names[k]} {list(b.shape)} vs torch {list(a.shape)}")
    result: dict[str, Any] = {"ok": ok, "outputs": names, "detail": "; ".join(detail),
                              "other_shapes": other_shapes}
    if not ok:  # would the model's own out0..outN order (or a reshape) have passed?
        def key(n: str) -> tuple[int, str]:
            m = re.fullmatch(r"out(\d+)", n)
            return (int(m.group(1)) if m else 1 << 30, n)

        ordered = [np.asarray(got[n]) for n in sorted(names, key=key)
                   if re.fullmatch(r"out\d+", n)]
        result["passes_in_out_order"] = len(ordered) == len(ref) and all(
            match(a, b)[0] for a, b in zip(ref, ordered, strict=True))
        result["passes_reshaped"] = len(vals) == len(ref) and all(
            a.size == b.size and match(a, b.reshape(a.shape))[0]
            for a, b in zip(ref, vals, strict=True))
    return result


def _alignment_counts(rep: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    name, frac = next(iter(rep.aligned_fraction.items()), (None, None))  # one candidate
    out["aligned_fraction"] = frac
    al = rep.alignments.get(name) if name is not None else None

    def count(v: Any) -> int | None:
        return None if v is None else (v if isinstance(v, int) else len(v))

    if al is not None:
        out["considered"] = al.considered
        out["aligned"] = count(getattr(al, "pairs", None))
        out["attributed"] = count(getattr(al, "attributed", None))
        unexplained = getattr(al, "unexplained", None)
        if unexplained is not None:
            out["unexplained"] = count(unexplained)
        else:  # counted ones only: al.unaligned may also list tensors not considered
            # considered excludes the attributed tensors (Alignment.considered)
            out["unexplained"] = al.considered - (out["aligned"] or 0)
        reasons = unexplained if isinstance(unexplained, dict) else al.unaligned
        out["unexplained_reasons"] = Counter(reason_group(r) for r in reasons.values()
                                             ).most_common(5)
    out["ok"] = bool(rep.ok)
    if not out["ok"]:
        out["summary"] = rep.summary().splitlines()[0] if rep.summary() else ""
    first = rep.first_divergence
    out["first_divergence"] = (f"{first.reference} ({first.op_type} {first.name})"
                               if first is not None else None)
    return out


def reason_group(reason: str) -> str:
    """A reason with its names, shapes and numbers blanked, so alike reasons group."""
    reason = re.sub(r"'[^']*'", "'…'", str(reason))
    reason = re.sub(r"\[[^\]]*\]", "[…]", reason)
    return re.sub(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "N", reason)


def run_case(path: Path) -> dict[str, Any]:
    """Everything about one case; runs in its own process (the cwd is a scratch folder)."""
    import importlib.util

    import torch

    torch.set_num_threads(1)  # two cases at once on two cores
    res: dict[str, Any] = {"case": path.stem, "outcome": None, "error": None}
    source = path.read_text()
    how = res["comparator"] = comparator(source)
    sys.path.insert(0, str(path.parent))
    captured: list[tuple[Any, tuple]] = []
    real_trace = torch.jit.trace

    def fake_trace(func: Any, example_inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        ex = example_inputs if example_inputs is not None else kwargs.get("example_inputs")
        ex = tuple(ex) if isinstance(ex, (tuple, list)) else (ex,)
        captured.append((func, tuple(t.clone() if isinstance(t, torch.Tensor) else t
                                     for t in ex)))
        raise _Traced

    t0 = time.perf_counter()
    torch.jit.trace = fake_trace
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.test()
    except _Traced:
        pass
    except BaseException as e:  # an import failure or a test that breaks before tracing
        extra = _needs_extra(e)
        if extra:
            res["outcome"] = "needs torchvision/torchaudio"
            res["error"] = {"stage": "import", "class": type(e).__name__,
                            "first_line": str(e), "hint": "", "workbench_error": False}
            return res
        if not captured:
            res["outcome"] = "refused"
            res["error"] = _error(e, "capture")
            res["error"]["traceback"] = traceback.format_exc()[-2000:]
            return res
    finally:
        torch.jit.trace = real_trace
    res["capture_s"] = time.perf_counter() - t0
    if not captured:
        res["outcome"] = "skipped"
        res["error"] = {"stage": "capture", "class": "-", "workbench_error": False,
                        "first_line": "test() returned without tracing a model", "hint": ""}
        return res
    model, inputs = captured[0]
    res["inputs"] = [f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                     if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs]
    return _through_workbench(res, model, inputs, how)


def _through_workbench(res: dict[str, Any], model: Any, inputs: tuple,
                       how: dict[str, Any]) -> dict[str, Any]:
    import torch

    import workbench as wb

    with torch.no_grad():
        ref = [t.detach().numpy() for t in _flatten(model(*[
            t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]))]
    res["torch_outputs"] = [list(a.shape) for a in ref]
    # the same tensors go to every step, as a user would pass them; a step that writes into
    # them is recorded (issue 16, finding 7), not hidden by giving each step a copy
    pristine = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]

    def mutated(step: str) -> None:
        if any(isinstance(t, torch.Tensor) and not torch.equal(t, p)
               for t, p in zip(inputs, pristine, strict=True)):
            res.setdefault("inputs_mutated_by", []).append(step)
            for t, p in zip(inputs, pristine, strict=True):  # measured on the case's inputs
                if isinstance(t, torch.Tensor):
                    t.copy_(p)

    stage = "to_ncnn"
    with tempfile.TemporaryDirectory(prefix="wb-corpus-ws-") as ws:
        try:
            t0 = time.perf_counter()
            art = wb.to_ncnn(model, inputs, workspace=ws)
            res["to_ncnn_s"] = time.perf_counter() - t0
            mutated("to_ncnn")
            res["to_ncnn_diagnostics"] = [f"{d.level} {d.code}: {d.message.splitlines()[0]}"
                                          for d in art.diagnostics
                                          if d.level in ("error", "warning")][:6]
            stage = "run"
            got = wb.runtime.NcnnRunner(art).run(inputs)
            mutated("NcnnRunner.run")
        except BaseException as e:
            kind = type(e).__name__  # ncnn died or hung in the workbench's worker
            res["outcome"] = {"BackendCrashed": "crashed", "BackendTimeout": "timeout"}.get(
                kind, "refused")
            res["error"] = _error(e, stage)
            reasons = _pnnx_log_reasons(Path(ws))
            if reasons:  # pnnx's own words, where a kept pnnx artifact holds its log
                told = f"{res['error']['message']}\n{res['error']['hint']}"
                res["error"]["pnnx_log_reasons"] = reasons
                res["error"]["names_pnnx_reason"] = any(r in told for r in reasons)
            if not getattr(e, "hint", None) and not isinstance(e, wb.WorkbenchError):
                res["error"]["traceback"] = traceback.format_exc()[-2000:]
            return res
        check = _compare_outputs(ref, got, how)
        res["ncnn_outputs"] = {n: list(getattr(v, "shape", ())) for n, v in got.items()}
        if not check["ok"]:
            res["outcome"] = "mismatch"
            res["mismatch"] = check
            # did to_ncnn say so? an error diagnostic on the artifact, with its hint
            flags = [d for d in art.diagnostics if d.level == "error"]
            res["mismatch"]["flagged"] = [{"code": d.code, "hint": d.hint} for d in flags]
            return res
        res["outcome"] = "pass"
        res["other_shapes"] = check["other_shapes"]  # passed as torch.allclose broadcasts
        try:
            t0 = time.perf_counter()
            rep = wb.compare(model, [art], inputs, progress=False)
            mutated("compare")
            res["compare"] = _alignment_counts(rep)
            res["compare"]["seconds"] = time.perf_counter() - t0
        except BaseException as e:
            res["compare"] = {"error": _error(e, "compare")}
    return res


def child_entry(case: str, scratch: str, conn: Any) -> None:
    """Run one case (in a fresh forked process); send its result as a JSON string."""
    try:
        os.setsid()  # the driver kills this group (with the ncnn worker, pnnx) on a timeout
    except OSError:
        pass
    fd = os.open(os.path.join(scratch, "case.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(scratch)  # a case that writes files writes them here
    path = Path(case)
    try:
        res = run_case(path)
    except BaseException as e:  # the bench's own failure, reported as a refusal
        res = {"case": path.stem, "outcome": "refused",
               "error": {"stage": "bench", "class": type(e).__name__,
                         "workbench_error": False, "first_line": str(e)[:300], "hint": "",
                         "traceback": traceback.format_exc()[-2000:]}}
    finally:
        try:
            from workbench.runtime.worker import worker

            worker().close()
        except Exception:
            pass
    conn.send(json.dumps(res, default=str))
    conn.close()
