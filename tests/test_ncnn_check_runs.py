"""to_ncnn's output check runs ncnn's fp32 and fp16 nets one after the other in the shared
worker (stages/ncnn_runs.py) and lets them go when it returns (worker.send_drops), also the
net its hints' capture run loaded (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.stages import ncnn_runs
from workbench.stages.ncnn_check import check_numbers


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x, y):
        return self.head(torch.relu(self.conv(x) + y))


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, 8, 8, generator=g), torch.randn(1, 4, 8, 8, generator=g)


def _reference(model: torch.nn.Module, args: tuple) -> list[np.ndarray]:
    with torch.no_grad():
        return [model(*args).numpy()]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    torch.manual_seed(0)
    model, args = Net().eval(), _inputs()
    nc = wb.to_ncnn(model, args, workspace=tmp_path_factory.mktemp("plain") / "ws")
    return nc.path, args, _reference(model, args)


def test_both_precisions_run_in_the_shared_worker_and_let_their_nets_go(plain,
                                                                       fresh_worker):
    param, args, ref = plain
    runs = ncnn_runs.run_precisions(param, args, ref)
    assert list(runs) == ["fp32", "fp16"]
    for run in runs.values():
        assert run.failure is None and run.pid == fresh_worker.pid
        assert run.errors["max_abs"] < 1e-3 and run.fitted[0].shape == ref[0].shape
    assert fresh_worker.pending_drops == []  # sent when the check returned
    assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 0


def test_the_check_leaves_no_net_in_the_shared_worker_also_after_its_hints(plain,
                                                                           fresh_worker):
    """A mismatch takes a capture run for its hints (ncnn_hints.capture_blobs): that net
    is let go when the check returns too, not held until the worker's next call."""
    param, args, ref = plain
    metrics, diags = check_numbers(param, args, [ref[0] + 1.0])
    assert [d.code for d in diags][:1] == ["ncnn-numeric-mismatch"]
    assert fresh_worker.pending_drops == []
    assert fresh_worker.call({"op": "ping"}, "test")["runners"] == 0
