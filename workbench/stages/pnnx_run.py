"""Running pnnx and reading its log: the binary as a checked subprocess (a timeout, each pass
it announces a progress step), its exit judged, its "not supported" lines as diagnostics, and
the hint its log points to (stages/ncnn.py runs the conversion around it)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from ..diagnostics import Diagnostic
from ..errors import ConversionError
from ..progress import Steps

PNNX_PASSES = ("level0", "level1", "level2", "level3", "level4", "level5", "ncnn")


def _run_pnnx(cmd: list[str], cwd: Path, timeout: float, steps: Steps | None = None,
              on_pass: Callable[[str], None] | None = None) -> tuple[str, int]:
    """Run pnnx, its log read line by line as it goes (each pass it announces is a step,
    and ``on_pass`` is called with its name: "level0"... "ncnn")."""
    import threading

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, errors="replace")
    killed: list[bool] = []
    timer = threading.Timer(timeout, lambda: proc.poll() is None and (  # exited: not a timeout
        killed.append(True), proc.kill()))
    timer.start()
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            m = re.match(r"#+ pass_(\w+)", line)
            if m and m.group(1) in PNNX_PASSES:
                if steps is not None:
                    steps.phase(f"pnnx pass_{m.group(1)}")
                    steps.advance()
                if on_pass is not None:
                    on_pass(m.group(1))
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted while reading
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    log = re.sub(r"\x1b\[[0-9;]*m", "", "".join(lines))  # no terminal colours
    if killed:
        raise ConversionError(f"pnnx did not finish in {timeout:g} s" + _tail(log),
                              "pass a smaller input shape, or raise timeout=")
    return log, rc


def _check_exit(rc: int, log: str, cmd: list[str], causes: list[Diagnostic]) -> None:
    if rc == 0:
        return
    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
    cause = "".join(f"\nlikely cause: {d.message}" for d in causes)
    raise ConversionError(f"pnnx {how}{cause}" + _tail(log) + "\ncommand: " + " ".join(cmd),
                          causes[0].hint if causes else _hint_for(log))


def _tail(log: str, n: int = 15) -> str:
    """pnnx's own reasons (every 'not supported' line, wherever it sits in the log), then
    the log's last lines."""
    lines = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith("#####")]
    reasons = list(dict.fromkeys(ln.strip() for ln in lines
                                 if re.search(r"not supported|unsupported", ln, re.I)))
    out = ("\npnnx says: " + "; ".join(reasons[:5])) if reasons else ""
    return out + (("\npnnx log (last lines):\n" + "\n".join(lines[-n:])) if lines else "")


def _log_diagnostics(log: str) -> list[Diagnostic]:
    """Each 'not supported' line of the pnnx log as a Diagnostic naming the op (first word)."""
    diags, seen = [], set()
    for line in log.splitlines():
        line = line.strip()
        if re.search(r"not supported|unsupported", line, re.I) and line not in seen:
            seen.add(line)
            diags.append(Diagnostic("warning", "pnnx-unsupported", f"pnnx: {line}",
                                    _hint_for(line), source=line.split()[0]))
    return diags


def _hint_for(log: str, bad: list[tuple[str, str]] | None = None) -> str:
    if m := re.search(r"Unknown builtin op: (\w+::\w+)", log):  # a Python-defined op
        return (f"pnnx cannot load {m.group(1)} from TorchScript (its code is Python in this "
                "process); convert the ONNX export instead, which keeps it as a named custom "
                "layer: wb.to_ncnn(wb.export(model, inputs))")
    if m := re.search(r"(\S+) is not a registered function/op|unexpected op_type (\S+)", log):
        return (f"the model holds an op pnnx does not know ({m.group(1) or m.group(2)}); lower it "
                "to standard ops before conversion, or register it as a custom op")
    if re.search(r"dynamic shape|batch axis", log, re.I):
        return "pass a fixed input shape (inputs=) and, for dynamic axes, inputs2="
    if m := re.search(r"^.*(?:not supported|unsupported).*$", log, re.I | re.M):
        reason = m.group(0).strip()
        if "step" in reason and "slice" in reason:
            return (f"pnnx: {reason}. Rewrite the strided slice (x[..., ::2]) with supported "
                    "ops, e.g. a reshape and index (x.unflatten(-1, (-1, 2))[..., 0]) or "
                    "torch.index_select with the indices")
        if bad:
            return (f"pnnx: {reason}. ncnn has no layer for what pnnx kept; rewrite that op "
                    "with supported ones, or register a custom ncnn layer (wb.custom_op)")
    if bad:
        return ("ncnn has no layer for these; keep the op on non-batch axes, rewrite it with "
                "supported ops, or register a custom ncnn layer (the custom-op helpers)")
    return ("read the pnnx log above for the op it stopped at; try optlevel=0, or convert the "
            "simplified ONNX artifact instead of the module")
