"""The stages refuse, before they load anything, work the memory available cannot hold
(capacity.check_fits wired into export, simplify and to_ncnn). The limit is real: a child
process caps its own address space (RLIMIT_AS) just above what it already maps, so what
capacity reads as available is a few hundred MB, below what the stage needs for a model of
~100 MB of weights; nothing of the stage is left in the workspace."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import resource, sys, json
    import torch
    import workbench as wb
    from workbench.errors import NotEnoughMemory

    ws = wb.Workspace(sys.argv[1])
    stage = sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5000, 5000)).eval()  # 100 MB of fp32
    x = torch.rand(1, 5000)
    onnx = None
    if stage != "export":
        onnx = wb.export(model, x, workspace=ws)
    before = sorted(p.name for p in ws.path.iterdir())
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (150 << 20), resource.RLIM_INFINITY))
    try:
        if stage == "export":
            wb.export(model, x, workspace=ws)
        elif stage == "simplify":
            wb.simplify(onnx)
        else:
            wb.to_ncnn(onnx)
    except NotEnoughMemory as e:
        after = sorted(p.name for p in ws.path.iterdir())
        print(json.dumps({"message": e.message, "hint": e.hint, "same": before == after}))
    else:
        print(json.dumps({"message": None}))
""")


def _refused(tmp_path, stage: str) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ws"), stage],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_export_refuses_a_model_the_memory_cannot_hold(tmp_path):
    got = _refused(tmp_path, "export")
    assert got["message"] and "exporting Sequential" in got["message"], got
    assert "RLIMIT_AS" in got["message"] + got["hint"] or "address" in got["message"], got
    assert got["same"]


def test_simplify_and_to_ncnn_refuse_before_loading(tmp_path):
    for stage, what in (("simplify", "simplifying model.onnx"),
                        ("to_ncnn", "converting to ncnn")):
        got = _refused(tmp_path / stage, stage)
        assert got["message"] and what in got["message"], (stage, got)
        assert "MB" in got["message"] or "GB" in got["message"] or "bytes" in got["message"]
        assert got["same"], stage
