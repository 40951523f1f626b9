"""to_ncnn's output check runs ncnn's fp32 and fp16 nets at once, each in a native worker
process of its own (stages/ncnn_runs.py; issue 34): the same metrics and diagnostics as one
after the other, a crash in one worker leaves the other's result, and the second worker is
closed after the check."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.runtime import worker as worker_mod
from workbench.stages import ncnn_runs
from workbench.stages.ncnn_check import check_numbers

CRASH_ENV = "WBTEST_NCNN_CHECK_CRASH"  # the custom layer segfaults in a process that has it


class Net(torch.nn.Module):
    def __init__(self, op=None) -> None:
        super().__init__()
        self.op = op
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x, y):
        h = self.conv(x)
        h = self.op(h, y) if self.op is not None else h + y
        return self.head(torch.relu(h))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, 8, 8, generator=g), torch.randn(1, 4, 8, 8, generator=g)


def _reference(model: torch.nn.Module, args: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        return [model(*args).numpy()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    torch.manual_seed(0)
    model, args = Net().eval(), _inputs()
    nc = wb.to_ncnn(model, args, workspace=tmp_path_factory.mktemp("plain") / "ws")
    return nc.path, args, _reference(model, args)


def test_fp32_and_fp16_run_in_two_worker_processes_and_the_second_is_closed(plain,
                                                                         fresh_worker):
    param, args, ref = plain
    runs = ncnn_runs.run_precisions(param, args, ref, side_by_side=True)
    assert list(runs) == ["fp32", "fp16"]
    assert all(r.failure is None for r in runs.values())
    assert runs["fp32"].pid == fresh_worker.pid  # the shared native worker
    spare = runs["fp16"].pid
    assert spare not in (None, os.getpid(), fresh_worker.pid)
    assert not _alive(spare)  # closed with its net after the check
    assert not [k for k in worker_mod._TARGETED if k.startswith("native-")]
    # the same numbers as one after the other, both in the shared worker
    seq = ncnn_runs.run_precisions(param, args, ref, side_by_side=False)
    assert {r.pid for r in seq.values()} == {fresh_worker.pid}
    for p in ncnn_runs.PRECISIONS:
        for a, b in zip(runs[p].got, seq[p].got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_check_numbers_says_the_same_side_by_side_as_one_after_the_other(plain, fresh_worker):
    param, args, ref = plain
    both = [check_numbers(param, args, ref, side_by_side=s) for s in (True, False)]
    assert fresh_worker.pending_drops == []  # the last twin let go, not kept to a next call
    assert both[0][0] == both[1][0]
    assert both[0][0]["max_abs"] < 1e-4
    assert [(d.code, d.message) for d in both[0][1]] == [(d.code, d.message)
                                                        for d in both[1][1]]
    if both[0][0].get("fp16_exercised") is False:  # x86: ncnn computes fp32 throughout
        assert [d.code for d in both[0][1]] == ["fp16-not-exercised"]


def test_the_check_leaves_no_net_in_the_shared_worker_also_after_its_hints(plain,
                                                                           fresh_worker):
    """A mismatch takes a capture run for its hints (ncnn_hints.capture_blobs): that net
    is let go when the check returns too, not held until the worker's next call."""
    param, args, ref = plain
    metrics, diags = check_numbers(param, args, [ref[0] + 1.0], side_by_side=False)
    assert [d.code for d in diags][:1] == ["ncnn-numeric-mismatch"]
    assert fresh_worker.pending_drops == []
    assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 0


def test_side_by_side_only_for_a_large_model_whose_two_nets_fit_with_idle_cores(
        plain, monkeypatch):
    param = plain[0]
    size = param.stat().st_size + param.with_suffix(".bin").stat().st_size
    roomy = 10 * size
    # too small for a second process to pay
    assert not ncnn_runs.fits_side_by_side(param, available=roomy, idle=8.0)
    monkeypatch.setattr(ncnn_runs, "SIDE_BY_SIDE_BYTES", size)
    assert ncnn_runs.fits_side_by_side(param, available=roomy, idle=4.0)
    # a core short (each run's two ncnn threads): one after the other, where the second
    # load reuses the first's memory; so on a 2-core machine, whatever its load
    assert not ncnn_runs.fits_side_by_side(param, available=roomy, idle=3.5)
    assert not ncnn_runs.fits_side_by_side(param, available=roomy, idle=2.0)
    # both nets at once need twice ncnn's factor: room for one only -> one after the other
    assert ncnn_runs.fits_side_by_side(param, available=int(size * 3.5), idle=4.0)
    assert not ncnn_runs.fits_side_by_side(param, available=int(size * 2.5), idle=4.0)


def test_idle_cores_is_sampled_from_the_machine():
    idle = ncnn_runs.idle_cores(0.05)
    assert 0.0 <= idle <= (os.cpu_count() or 1) + 1e-9


def _plus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def _plus_or_crash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if os.environ.get(CRASH_ENV):
        import ctypes

        ctypes.string_at(0)  # a real segfault, in the worker that runs this layer
    return a + b


@pytest.fixture
def crashing_op():
    op = wb.custom_op("wbtest::plus_or_crash", _plus, mutates_args=(),
                      schema="(Tensor a, Tensor b) -> Tensor", ncnn=_plus_or_crash)
    yield op
    wb.unregister("wbtest::plus_or_crash")


def test_a_crash_in_the_fp16_worker_fails_fp16_alone(crashing_op, fresh_worker, tmp_path,
                                                     monkeypatch):
    """The custom layer crashes in a worker started with CRASH_ENV set: the shared worker
    runs before it is set, the fp16 worker (started by the check) after. fp32's figures
    stay; fp16 is ncnn-run-failed naming the crash; the custom op reached both workers."""
    torch.manual_seed(0)
    model, args = Net(crashing_op).eval(), _inputs()
    onx = wb.export(model, args, workspace=tmp_path / "ws")
    nc = wb.to_ncnn(onx)
    assert nc.metrics["max_abs"] < 1e-4
    ref = _reference(model, args)
    fresh_worker.call({"op": "ping"}, "test")  # started without CRASH_ENV
    monkeypatch.setenv(CRASH_ENV, "1")
    metrics, diags = check_numbers(Path(nc.path), args, ref, side_by_side=True)
    assert metrics["max_abs"] < 1e-4 and metrics["max_abs_fp16"] is None
    assert "fp16_exercised" not in metrics
    failed = [d for d in diags if d.code == "ncnn-run-failed"]
    assert len(failed) == 1 and failed[0].message.startswith("ncnn (fp16) cannot run")
    assert "SIGSEGV" in failed[0].message and failed[0].hint
    assert [d.code for d in diags] == ["ncnn-run-failed"]
    assert fresh_worker.alive and fresh_worker.pending_drops == []  # fp32's lives on
    assert not [k for k in worker_mod._TARGETED if k.startswith("native-")]
