"""A disk too small: a hinted NotEnoughDisk naming the folder and the space, before writing
when the need is known, and from ENOSPC mid-write with nothing half written left behind.
On a real 1 MiB tmpfs (mounted here; we are root in the test VM)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import workbench as wb
from workbench.capacity import check_space, disk_errors, free_space
from workbench.errors import NotEnoughDisk, WorkspaceError


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB filesystem of its own (tmpfs), unmounted afterwards."""
    folder = tmp_path / "small"
    folder.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a 1 MiB tmpfs here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _onnx(path, n):
    """An ONNX MatMul with an n x n fp32 weight (n*n*4 bytes inside the file)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((n, n), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    onnx.save_model(helper.make_model(g), path)
    return path


def test_a_known_need_is_refused_before_writing(small_disk):
    free = free_space(small_disk)
    assert 0 < free <= 2**20
    check_space(small_disk, free // 2, "captures")  # fits: nothing said
    with pytest.raises(NotEnoughDisk) as e:
        check_space(small_disk / "not-yet", 5 * 2**20, "the captured tensors of 'resnet'")
    err = e.value
    assert str(small_disk / "not-yet") in err.message and "captured tensors" in err.message
    assert f"{5 * 2**20:,} bytes" in err.message and f"{free:,} bytes" in err.message
    assert err.need == 5 * 2**20 and err.free == free and isinstance(err, OSError)
    assert "larger disk" in err.hint


def test_a_stage_that_fills_the_disk_leaves_nothing_and_says_where(small_disk, tmp_path):
    ws = wb.Workspace(small_disk / "ws")
    manifest = (ws.path / "manifest.json").read_bytes()
    before = free_space(small_disk)
    big = _onnx(tmp_path / "big.onnx", 600)  # 1.4 MB of weights into 1 MiB
    with pytest.raises(NotEnoughDisk) as e:
        ws.import_file(big)
    err = e.value
    assert str(ws.path) in err.message and "No space left on device" in err.message
    assert "had been written when the disk filled" in err.message and err.need > 0
    assert "was removed" in err.message and "larger disk" in err.hint
    assert isinstance(err.__cause__, OSError) and not isinstance(err.__cause__, NotEnoughDisk)
    # nothing half written: no staging folder, the manifest as it was, the space back
    assert sorted(p.name for p in ws.path.iterdir()) == [".lock", "manifest.json"]
    assert (ws.path / "manifest.json").read_bytes() == manifest
    assert free_space(small_disk) >= before - 4096 and len(ws) == 0
    art = ws.import_file(_onnx(tmp_path / "small.onnx", 16))  # the workspace still works
    assert len(wb.Workspace(ws.path)) == 1 and art.path.is_file()


def test_an_export_that_fills_the_disk_is_said_as_the_disk_not_as_an_export_bug(small_disk):
    import torch

    ws = wb.Workspace(small_disk / "ws")
    with pytest.raises(NotEnoughDisk) as e:  # the exporter's OSError wrapped in ExportError
        wb.export(torch.nn.Linear(600, 600), (torch.randn(1, 600),), workspace=ws)
    assert str(ws.path) in e.value.message
    assert not list(ws.path.glob(".staging-*")) and len(ws) == 0


def test_other_os_errors_pass_through(tmp_path):
    with pytest.raises(PermissionError), disk_errors(tmp_path, "x"):
        raise PermissionError(13, "Permission denied")
    with pytest.raises(WorkspaceError), disk_errors(tmp_path, "x"):
        raise WorkspaceError("not a disk problem")
    with pytest.raises(NotEnoughDisk) as e, disk_errors(tmp_path, "x", need=10):
        raise OSError(28, os.strerror(28))
    assert "it needs 10 bytes" in e.value.message


def test_a_full_disk_with_nothing_written_here_says_what_is_free_not_a_need_of_zero(tmp_path):
    """ENOSPC where the failing stage wrote nothing in its own folder (pnnx filled the disk
    from a folder beside it): the message gives the space free on that disk, not "it needs
    more than the 0 bytes free" (what a to_ncnn on a full disk said)."""
    with pytest.raises(NotEnoughDisk) as e, disk_errors(tmp_path, "the ncnn model"):
        raise OSError(28, os.strerror(28))
    import re

    # the space free then (another process may write meanwhile: not compared to now's)
    assert re.search(r"; [\d,]+ bytes \([^)]*\) is free on that disk now", e.value.message)
    assert "needs more than the" not in e.value.message
