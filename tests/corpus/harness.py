"""Run one fault case in a child process of its own and classify what happened.

The child is forked from a forkserver that has torch, onnx and the workbench imported (a fresh
process per case without paying the imports each time). It makes itself a process group (so a
timeout kills it with its backend worker), caps its address space (RLIMIT_AS), works in its own
folder (cwd and TMPDIR), prepares the case's inputs, snapshots the sandbox around that folder,
then runs the action and sends back what it returned or raised. The parent classifies; it also
checks the workspace's artifacts and the sandbox snapshot after the child is gone (a child that
died cannot report).

Layout of one case: ``<root>/<case id>/`` is the sandbox; ``sandbox/a/b/c/case/`` the case
folder with ``in/`` (files the case prepares), ``ws/`` (its workspace, a copy of base/ws) and
``tmp/`` (cwd, TMPDIR). Anything created or changed in the sandbox outside ``ws/`` and
``tmp/`` after the inputs were prepared is a write outside the workspace.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLASSES = ("hinted", "ok", "unhinted", "foreign", "refused", "silent wrong", "died", "hang",
           "artifact lost", "write outside")
GENERIC_HINTS = (
    "the model or the inputs are not what the backend expects",
    "this is a workbench bug",
    "read the pnnx log",
)
MEMORY_CAP = 4 << 30
PRELOAD = ["numpy", "torch", "onnx", "onnxruntime", "workbench", "workbench.runtime.remote",
           "workbench.onnx_io", f"{__package__}.actions"]


@dataclass
class Case:
    """One fault. ``expect``: "error" (only a refusal is right; a result is checked and
    a wrong one is silent wrong), "ok" (succeeding is right, result checked) or "either"
    (a correct result or a hinted refusal). ``hint_known``: the engine already gives a
    hinted error here (the lean test asserts it)."""

    id: str
    family: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    expect: str = "error"
    timeout: float = 60.0
    damages: list[str] = field(default_factory=list)  # artifact ids the case damages itself


@dataclass
class Result:
    id: str
    family: str
    kind: str
    cls: str
    expect: str
    error_type: str = ""
    message: str = ""
    hint: str = ""
    detail: str = ""
    seconds: float = 0.0
    extra: list[str] = field(default_factory=list)  # further classes (artifact lost...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hinted(hint: str) -> bool:
    h = (hint or "").strip().lower()
    return len(h) >= 12 and not any(h == g or h.startswith(g) for g in GENERIC_HINTS)


# -- the sandbox -----------------------------------------------------------------------------
def case_dir(sandbox: Path) -> Path:
    return sandbox / "a" / "b" / "c" / "case"


def snapshot(sandbox: Path) -> dict[str, list]:
    """Every path in the sandbox except the workspace and tmp, with size and mtime."""
    skip = {case_dir(sandbox) / "ws", case_dir(sandbox) / "tmp"}
    out: dict[str, list] = {}
    for dirpath, dirnames, filenames in os.walk(sandbox, followlinks=False):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for n in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / n
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(sandbox))] = [st.st_size, st.st_mtime_ns, st.st_mode]
    return out


def snapshot_diff(before: dict[str, list], after: dict[str, list]) -> list[str]:
    changed = [f"+{k}" for k in after if k not in before]
    changed += [f"~{k}" for k in after if k in before and after[k] != before[k]]
    changed += [f"-{k}" for k in before if k not in after]
    return sorted(changed)


def check_artifacts(ws_path: Path, index: dict[str, Any], damages: list[str]) -> str:
    """'' if every base artifact is still in the workspace with its files unchanged."""
    import workbench as wb

    problems = []
    for art_id, files in index["artifacts"].items():
        for rel, sha in files.items():
            if art_id in damages:
                continue
            f = ws_path / art_id / rel
            if not f.is_file():
                problems.append(f"{art_id}/{rel} gone")
            else:
                from workbench.fileio import sha256_file

                if sha256_file(f) != sha:
                    problems.append(f"{art_id}/{rel} changed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ws = wb.Workspace(ws_path)
            ids = {a.id for a in ws.artifacts}
            problems += [f"{i} not in Workspace.artifacts" for i in index["artifacts"]
                         if i not in ids and i not in damages]
            try:
                problems += [p for p in ws.verify() if p.split(":")[0] not in damages]
            except OSError as e:  # verify itself failed (an engine bug, reported as found)
                if not damages:
                    problems.append(f"ws.verify() raised {type(e).__name__}: {e}")
    except wb.WorkbenchError as e:  # the case left it unopenable on purpose (a folder .lock)
        if not any(x in damages for x in ("*open",)):
            problems.append(f"reopen failed: {type(e).__name__}: {e.message}")
    return "; ".join(problems)


# -- the child -------------------------------------------------------------------------------
def _child(case: dict[str, Any], base: str, sandbox: str, conn: Any) -> None:
    import resource
    import tempfile

    os.setsid()
    sb = Path(sandbox)
    cd = case_dir(sb)
    for sub in ("in", "tmp"):
        (cd / sub).mkdir(parents=True, exist_ok=True)
    log = os.open(cd / "tmp" / "case.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(cd / "tmp")
    os.environ["TMPDIR"] = str(cd / "tmp")
    tempfile.tempdir = None
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    warnings.simplefilter("ignore")
    from . import actions

    ctx = actions.Context(Path(base), cd, case)
    try:
        act = actions.prepare(ctx)
    except BaseException as e:  # noqa: BLE001 - a corpus bug, reported as such
        conn.send({"phase": "prepare", "error": f"{type(e).__name__}: {e}",
                   "tb": traceback.format_exc()})
        return
    conn.send({"phase": "ready", "snapshot": snapshot(sb)})
    try:
        verdict, detail = act()
        msg = {"phase": "done", "verdict": verdict, "detail": detail}
    except BaseException as e:  # noqa: BLE001 - every exception is an outcome here
        import workbench as wb

        msg = {"phase": "done", "raised": type(e).__name__,
               "workbench": isinstance(e, wb.WorkbenchError),
               "message": str(getattr(e, "message", e))[:600],
               "hint": str(getattr(e, "hint", "") or "")[:400],
               "tb": traceback.format_exc()[-1500:]}
    conn.send(msg)
    conn.close()
    os._exit(0)  # no atexit: the worker is the group's, killed by the parent


_CTX: Any = None


def mp_context() -> Any:
    global _CTX
    if _CTX is None:
        import multiprocessing as mp

        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(PRELOAD)
    return _CTX


def run_case(case: Case, base: Path, root: Path, index: dict[str, Any]) -> Result:
    """Run ``case`` in a fresh child under ``root``; classify the outcome."""
    import shutil

    ctx = mp_context()
    sandbox = root / case.id
    if sandbox.exists():
        shutil.rmtree(sandbox)
    cd = case_dir(sandbox)
    cd.mkdir(parents=True)
    shutil.copytree(base / "ws", cd / "ws", symlinks=True)
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(asdict(case), str(base), str(sandbox), theirs),
                       daemon=False)
    t0 = time.monotonic()
    proc.start()
    theirs.close()
    msgs: list[dict[str, Any]] = []
    timed_out = False
    deadline = t0 + case.timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        try:
            if ours.poll(min(left, 0.5)):
                msgs.append(ours.recv())
                if msgs[-1].get("phase") in ("done", "prepare"):
                    break
            elif not proc.is_alive() and not ours.poll(0):
                break
        except (EOFError, OSError):
            break
    _kill_group(proc.pid)
    proc.join(5)
    seconds = time.monotonic() - t0
    res = Result(case.id, case.family, case.kind, "", case.expect, seconds=round(seconds, 2))
    last = msgs[-1] if msgs else {}
    ready = next((m for m in msgs if m.get("phase") == "ready"), None)
    if last.get("phase") == "prepare":
        res.cls, res.error_type = "foreign", "CorpusPrepareError"
        res.message = last["error"]
        res.detail = last.get("tb", "")[-800:]
        return res
    if timed_out:
        res.cls, res.message = "hang", f"no answer in {case.timeout:.0f} s"
    elif last.get("phase") != "done":
        res.cls = "died"
        res.message = f"child exit code {proc.exitcode}"
        res.detail = _log_tail(cd)
    else:
        _classify(res, last)
    if ready is not None:
        outside = snapshot_diff(ready["snapshot"], snapshot(sandbox))
        if outside:
            res.extra.append("write outside")
            res.detail = (res.detail + " | written outside: " + ", ".join(outside[:5]))[:1500]
    try:
        lost = check_artifacts(cd / "ws", index, case.damages)
    except Exception as e:  # noqa: BLE001 - reopening crashed: the artifacts are not reachable
        lost = f"reopening the workspace raised {type(e).__name__}: {e}"
    if lost:
        res.extra.append("artifact lost")
        res.detail = (res.detail + " | " + lost)[:1500]
    return res


def _classify(res: Result, msg: dict[str, Any]) -> None:
    if "raised" in msg:
        res.error_type, res.message, res.hint = msg["raised"], msg["message"], msg["hint"]
        if not msg["workbench"]:
            res.cls = "foreign"
            res.detail = msg.get("tb", "")[-600:]
        elif res.expect == "ok":
            res.cls = "refused"
        else:
            res.cls = "hinted" if hinted(msg["hint"]) else "unhinted"
        return
    res.detail = str(msg.get("detail", ""))[:800]
    res.cls = "ok" if msg["verdict"] == "ok" else "silent wrong"


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped process is killed when resumed
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _log_tail(cd: Path) -> str:
    try:
        return (cd / "tmp" / "case.log").read_text(errors="replace")[-600:]
    except OSError:
        return ""


def final_classes(res: Result) -> list[str]:
    """The case's class plus the sandbox/workspace ones it earned."""
    return [res.cls, *res.extra]


def dump(results: list[Result], out: Path) -> None:
    out.write_text(json.dumps([r.to_dict() for r in results], indent=1))
