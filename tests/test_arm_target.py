"""The ARM target of the ncnn runner: ncnn's own aarch64 build under QEMU user mode (set up by
``make arm-target``), run as the x86 runner is (crash isolation, captures, compare), where
fp16 arithmetic is real: an accumulation past fp16's 65504 is inf/NaN there, named as the
first divergence with its inputs' range, listed by ``rep.fp16_unsafe()`` and fixed by
``wb.ncnn_featmask``. Small models: each emulated process costs seconds to start."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from arm_probe import Probe, probe_input
from torch import nn

import workbench as wb
from workbench.errors import InputError
from workbench.runtime import NcnnRunner
from workbench.runtime.ncnn_arm import SLOWDOWN


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x))
        x = torch.relu(self.dw(x))
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    # a 1-D input: ncnn's InnerProduct over a 1-D blob takes the fp16 path that overflows
    # (over a (1, 64) blob, as a batch of one, it summed in fp32 on ARM too: measured)
    model, x = Probe().eval(), probe_input()
    ws = wb.Workspace(tmp_path_factory.mktemp("arm") / "ws")
    return model, x, wb.to_ncnn(model, (x,), workspace=ws)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(1, 3, 8, 8)
    ws = wb.Workspace(tmp_path_factory.mktemp("arm-small") / "ws")
    return model, x, wb.to_ncnn(model, (x,), workspace=ws)


def test_fp16_arithmetic_overflows_on_armv8_2_and_nowhere_else(probe):
    _, x, nc = probe
    got = {}
    for precision in ("fp32", "fp16-storage", "fp16"):
        r = NcnnRunner(nc, precision=precision, target="arm64-v8.2")
        got[precision] = float(r.run((x,))["out0"][0])
        assert os.path.basename(os.readlink(f"/proc/{r.worker_pid}/exe")).startswith("qemu")
    assert got["fp32"] == 1.0 and got["fp16-storage"] == 1.0
    assert np.isnan(got["fp16"])  # +inf and -inf lanes summed
    assert NcnnRunner(nc, precision="fp16", target="arm64-v8.2").flags.label == \
        "fp16 arithmetic"
    # x86's ncnn computes it in fp32 whatever is asked
    assert float(NcnnRunner(nc, precision="fp16").run((x,))["out0"][0]) == 1.0
    assert NcnnRunner(nc, precision="fp16").flags.label == "fp16 storage"


def test_a_target_without_fp16_arithmetic_says_what_runs_instead(probe):
    _, x, nc = probe
    r = NcnnRunner(nc, precision="fp16", target="arm64-v8.0")
    assert not r.flags.fp16_arithmetic and r.flags.fp16_storage
    assert [d.code for d in r.notes] == ["fp16-arithmetic-unavailable"]
    assert "fp16 storage with fp32 arithmetic" in r.notes[0].message
    assert float(r.run((x,))["out0"][0]) == 1.0
    assert NcnnRunner(nc, precision="fp16", target="arm64-v8.2").notes == []


def test_compare_names_the_overflow_and_the_feature_mask_fixes_it(probe):
    model, x, nc = probe
    arm = NcnnRunner(nc, precision="fp16", target="arm64-v8.2")
    # the storage emulation first: fp16_unsafe() still picks the candidate that computed in fp16
    emulated = NcnnRunner(nc, precision="fp16", emulate="arm-fp16")
    rep = wb.compare(model, [emulated, arm], (x,), mode="both", progress=False)
    name = next(c.name for c in rep.candidates if c.runner is arm)
    assert "fp16 arithmetic arm64-v8.2" in name
    first = rep.divergences()[name]
    assert first.node == "linear_0" and first.reference == "fc"
    line = next(ln for ln in rep.summary().splitlines() if ln.startswith(name))
    assert "inf/NaN where the reference is finite" in line
    assert "its inputs reach 250" in line and "65504" in line
    risks = rep.fp16_unsafe()
    assert risks.layers == ["linear_0"] and risks[0].overflow
    assert risks[0].input_max == 250.0 and risks[0].output_max == 1.0
    fixed = wb.ncnn_featmask(nc, risks.layers, fp16_arithmetic=False)
    arm_fixed = NcnnRunner(fixed, precision="fp16", target="arm64-v8.2")
    assert float(arm_fixed.run((x,))["out0"][0]) == 1.0  # exact again
    rep2 = wb.compare(model, [arm_fixed], (x,), mode="both", progress=False)
    assert rep2.ok and rep2.fp16_unsafe().layers == []


def test_arm_fp32_captures_every_blob_as_x86_does(small):
    model, x, nc = small
    x86 = NcnnRunner(nc).run((x,), capture="all")
    arm = NcnnRunner(nc, target="arm64-v8.2").run((x,), capture="all")
    assert list(arm) == list(x86)
    for name, v in x86.items():
        np.testing.assert_allclose(arm[name], v, rtol=1e-4, atol=1e-4 * np.abs(v).max())
    rep = wb.compare(model, [NcnnRunner(nc, target="arm64-v8.2")], (x,), mode="both",
                     progress=False)
    assert rep.ok, rep.summary()
    assert next(iter(rep.aligned_fraction.values())) == 1.0


def test_an_unknown_target_and_runs_it_cannot_take_are_clear_errors(probe, tmp_path,
                                                                   monkeypatch):
    _, _, nc = probe
    with pytest.raises(InputError, match="unknown ARM target 'arm64-v9'") as e:
        NcnnRunner(nc, target="arm64-v9")
    assert "arm64-v8.2" in e.value.hint
    with pytest.raises(InputError, match="runs only in its emulated worker"):
        NcnnRunner(nc, target="arm64-v8.2", isolated=False)
    with pytest.raises(InputError, match="emulate='arm-fp16' with target"):
        NcnnRunner(nc, precision="fp16", target="arm64-v8.2", emulate="arm-fp16")
    with pytest.raises(InputError, match="precision='fp8'"):
        NcnnRunner(nc, precision="fp8", target="arm64-v8.2")
    monkeypatch.setenv("WORKBENCH_ARM64", str(tmp_path / "nothing"))
    with pytest.raises(InputError) as e:
        NcnnRunner(nc, target="arm64-v8.2")
    assert "make arm-target" in e.value.hint


def test_the_emulated_worker_crashing_is_backend_crashed_and_the_next_run_works(small):
    _, x, nc = small
    r = NcnnRunner(nc, target="arm64-v8.0")
    assert r.timeout >= 300 * SLOWDOWN  # scaled to the emulation, not a native run's
    r.run((x,))
    pid = r.worker_pid
    done = threading.Event()

    def kill() -> None:  # a segfault in the emulated process (the current one), mid-run
        while not done.is_set():
            now = r.worker_pid
            if now is not None:
                try:
                    os.kill(now, signal.SIGSEGV)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        with pytest.raises(wb.BackendCrashed) as e:
            for _ in range(50):
                r.run((x,), capture="all")
    finally:
        done.set()
        killer.join()
    assert e.value.backend == "ncnn (fp32 arm64-v8.0)"
    assert "aarch64" in e.value.hint and "target=None" in e.value.hint
    out = r.run((x,))["out0"]  # a fresh emulated worker
    assert r.worker_pid != pid and np.isfinite(out).all()


def test_an_int8_model_runs_on_arm_with_its_own_kernels_and_compares(small):
    model, x, nc = small
    g = torch.Generator().manual_seed(2)
    samples = [torch.randn(1, 3, 8, 8, generator=g) for _ in range(4)]
    q8 = wb.quantize(nc, samples, backend="ncnn", progress=False)
    arm = NcnnRunner(q8, target="arm64-v8.2")
    assert arm.flags.int8 and arm.flags.label.startswith("int8")
    x86_out = NcnnRunner(q8).run((x,))["out0"]
    arm_out = arm.run((x,))["out0"]
    with torch.no_grad():
        ref = model(x).numpy()
    # int8 on both, close to the float model; ARM's int8 kernels are its own (not compared
    # bit for bit with x86's)
    for out in (x86_out, arm_out):
        assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()
    rep = wb.compare(model, [q8, arm], (x,), progress=False)
    names = [c.name for c in rep.candidates]
    assert any(n.startswith("ncnn int8 arm64-v8.2") for n in names), names
    assert all(f > 0.9 for f in rep.aligned_fraction.values()), rep.aligned_fraction


def test_compare_says_what_ran_on_a_target_without_fp16_arithmetic(probe):
    model, x, nc = probe
    v80 = NcnnRunner(nc, precision="fp16", target="arm64-v8.0")
    rep = wb.compare(model, [v80], (x,), progress=False)
    note = next(iter(rep.notes.values()))
    assert "fp16 storage with fp32 arithmetic" in note
    assert "fp16 storage arm64-v8.0" in rep.candidates[0].name
