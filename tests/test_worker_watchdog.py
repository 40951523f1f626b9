"""A stalled or slow worker cannot hang the caller; a vanished /dev/shm folder is made again."""

from __future__ import annotations

import os
import shutil
import signal
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench as wb
from workbench.runtime import OrtRunner
from workbench.runtime import worker as worker_mod


def _matmuls(tmp_path, n: int = 1, size: int = 8):
    """y = x @ W @ W ... (n times): slow for a large ``size`` and ``n``."""
    w = numpy_helper.from_array(np.eye(size, dtype=np.float32), "W")
    names = ["x"] + [f"h{i}" for i in range(1, n)] + ["y"]
    nodes = [helper.make_node("MatMul", [names[i], "W"], [names[i + 1]]) for i in range(n)]
    graph = helper.make_graph(nodes, "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [size, size])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / f"mm{n}x{size}.onnx"
    onnx.save(model, path)
    return path


def test_a_stopped_worker_raises_backend_timeout_and_a_fresh_one_takes_over(tmp_path,
                                                                            fresh_worker):
    r = OrtRunner(_matmuls(tmp_path))
    assert r.worker_pid is None  # not used yet
    x = np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(r.run(x)["y"], x)
    pid = r.worker_pid
    assert pid == fresh_worker.pid and pid != os.getpid()
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while worker_mod._proc_stat(pid)[0] != "T" and time.monotonic() < deadline:
        time.sleep(0.05)  # the stop is asynchronous: wait until the kernel shows it
    assert worker_mod._proc_stat(pid)[0] == "T"
    t0 = time.monotonic()
    with pytest.raises(wb.BackendTimeout) as e:
        r.run(x)
    waited = time.monotonic() - t0
    assert waited < worker_mod.Worker.STOPPED_SECONDS + 5, waited
    assert f"pid {pid}" in e.value.message and "is stopped" in e.value.message
    assert "timeout=" in e.value.hint and "fresh worker" in e.value.hint
    np.testing.assert_array_equal(r.run(x)["y"], x)  # a new worker serves it
    assert r.worker_pid not in (None, pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the stopped one is gone, not left behind


def test_a_call_past_its_timeout_is_abandoned(tmp_path, fresh_worker):
    slow = OrtRunner(_matmuls(tmp_path, n=24, size=1536), timeout=0.5)
    assert slow.timeout == 0.5
    x = np.ones((1536, 1536), np.float32)
    t0 = time.monotonic()
    with pytest.raises(wb.BackendTimeout, match=r"did not answer within timeout=0\.5 s"):
        slow.run(x)
    assert time.monotonic() - t0 < 10
    fast = OrtRunner(_matmuls(tmp_path))
    y = fast.run(np.ones((8, 8), np.float32))["y"]  # the next call gets a fresh worker
    np.testing.assert_array_equal(y, np.ones((8, 8), np.float32))


def test_the_default_timeout_is_generous_and_grows_with_the_model(tmp_path):
    small = OrtRunner(_matmuls(tmp_path))
    big = OrtRunner(_matmuls(tmp_path, size=2048))  # a 16 MB weight
    assert small.timeout >= 300
    assert big.timeout - small.timeout == pytest.approx(2 * 16.8, abs=1.0)
    assert OrtRunner(_matmuls(tmp_path), isolated=False).timeout is None
    assert OrtRunner(_matmuls(tmp_path), isolated=False).worker_pid is None


@pytest.mark.parametrize("bad", [0, -1, "10", True, float("nan")])
def test_a_bad_timeout_is_a_clear_error(tmp_path, bad):
    with pytest.raises(wb.InputError, match="is not a number of seconds > 0"):
        OrtRunner(_matmuls(tmp_path), timeout=bad)
    r = OrtRunner(_matmuls(tmp_path))
    with pytest.raises(wb.InputError):
        r.timeout = bad


def test_a_removed_worker_folder_is_made_again(tmp_path, fresh_worker):
    r = OrtRunner(_matmuls(tmp_path))
    x = np.ones((8, 8), np.float32)
    r.run(x)
    shutil.rmtree(fresh_worker.dir)  # a tmp cleaner, another job wiping /dev/shm
    np.testing.assert_array_equal(r.run(x)["y"], x)
    np.testing.assert_array_equal(OrtRunner(_matmuls(tmp_path)).run(x)["y"], x)
    assert fresh_worker.dir.is_dir()
    # and when the worker must be started again after that
    os.kill(fresh_worker.pid, signal.SIGKILL)
    with pytest.raises(wb.BackendCrashed):
        r.run(x)
    shutil.rmtree(fresh_worker.dir)
    np.testing.assert_array_equal(r.run(x)["y"], x)


def test_proc_stat_reads_state_and_cpu_time():
    state, cpu = worker_mod._proc_stat(os.getpid())
    assert state == "R" and isinstance(cpu, int) and cpu >= 0
    assert worker_mod._proc_stat(2 ** 22 + 12345) == ("?", None)


def test_compare_passes_its_timeout_to_the_candidates(tmp_path, fresh_worker):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).eval()
    x = torch.randn(8, 8)
    onx = wb.export(model, (x,), workspace=tmp_path / "ws")
    runner = OrtRunner(onx)
    rep = wb.compare(model, [runner], (x,), progress=False, timeout=42)
    assert runner.timeout == 42 and rep.ok
    with pytest.raises(wb.InputError, match="is not a number of seconds > 0"):
        wb.compare(model, [runner], (x,), progress=False, timeout=-1)
