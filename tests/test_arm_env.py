"""The ARM target's environment (workbench.runtime.arm_env): installed by `make arm-target`,
found, and really ncnn's aarch64 build under QEMU user mode, with the CPU each target stands
for. Each emulated start costs about a second, so one run per target serves several tests."""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
from pathlib import Path

import pytest

from workbench.errors import InputError
from workbench.runtime import arm_env as ae

ROOT = Path(__file__).resolve().parents[1]

FEATURES = """
import json, ncnn
from workbench.runtime.arm_env import hwcaps
print(json.dumps(dict(hwcaps(), ncnn_asimdhp=bool(ncnn.cpu_support_arm_asimdhp()),
                      cpus=ncnn.get_cpu_count(), version=ncnn.__version__)))
"""

# ncnn's options default to fp16 on: each must be set before load_param
PROBE = """
import json, sys
import numpy as np, ncnn
out = {}
for stem in sys.argv[1:]:
    for fp16a in (False, True):
        net = ncnn.Net()
        net.opt.use_fp16_arithmetic = fp16a
        net.opt.num_threads = 1
        net.load_param(stem + ".param")
        net.load_model(stem + ".bin")
        x = np.full(64, 250.0, np.float32)  # kept alive: ncnn.Mat shares its memory
        ex = net.create_extractor()
        ex.input("in", ncnn.Mat(x))
        _, y = ex.extract("out")
        out[f"{stem.rsplit('/', 1)[-1]} fp16a={fp16a}"] = repr(float(np.array(y).ravel()[0]))
print(json.dumps(out))
"""


def _emulated(name: str, argv: list[str]) -> dict:
    env = ae.arm_env()
    proc = subprocess.run(ae.command(env, ae.target(name), argv),
                          env=ae.environ(env, [str(ROOT)]), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def features() -> dict[str, dict]:
    return {name: _emulated(name, ["-c", FEATURES]) for name in ae.TARGETS}


def _pin(lock: str, package: str) -> str:
    return re.search(rf"^{package}==(\S+)", (ROOT / lock).read_text(), re.M).group(1)


def test_make_arm_target_installs_every_piece_where_arm_env_finds_it():
    env = ae.arm_env()
    assert env.qemu.name == "qemu-aarch64-static" and env.qemu.is_file()
    assert env.python == env.sysroot / "usr/bin/python3.11" and env.python.is_file()
    assert (env.site_packages / "ncnn").is_dir() and (env.site_packages / "numpy").is_dir()
    for arm in ae.TARGETS.values():  # the machine descriptions are this module's, current
        top = env.machines / arm.name
        for rel, text in ae.machine_files(arm).items():
            assert (top / rel).read_text() == text, f"{top / rel}: make arm-target"
        assert (top / "usr/bin/python3.11").samefile(env.python)
    # the aarch64 build is the x86 one's version, numpy too
    for package in ("ncnn", "numpy"):
        assert _pin("requirements-arm64.lock", package) == _pin("requirements.lock", package)
    assert env.ncnn_version == _pin("requirements.lock", "ncnn")


def test_command_starts_the_sysroot_python_under_qemu_as_the_target():
    env, arm = ae.arm_env(), ae.target("arm64-v8.2")
    cmd = ae.command(env, arm, ["-c", "pass"])
    assert cmd == [str(env.qemu), "-L", str(env.machines / "arm64-v8.2"), "-cpu", "cortex-a76",
                   str(env.python), "-s", "-c", "pass"]


def test_environ_keeps_the_host_python_and_loader_out(monkeypatch):
    for key, value in (("PYTHONPATH", "/host/site-packages"), ("PYTHONHOME", "/usr"),
                       ("LD_PRELOAD", "/host/libx86.so"), ("QEMU_CPU", "max")):
        monkeypatch.setenv(key, value)
    env = ae.arm_env()
    out = ae.environ(env, [str(ROOT)])
    assert out["PYTHONPATH"].split(":") == [str(env.site_packages), str(ROOT)]
    assert not {"PYTHONHOME", "LD_PRELOAD", "QEMU_CPU"} & set(out)
    assert out["PATH"]  # the rest of this environment is kept


@pytest.mark.parametrize("name", list(ae.TARGETS))
def test_ncnn_under_each_target_finds_the_features_it_stands_for(features, name):
    arm, seen = ae.target(name), features[name]
    assert seen["version"] == ae.arm_env().ncnn_version
    assert seen["ncnn_asimdhp"] is arm.fp16_arithmetic  # v8.2 and v8.6 true, v8.0 false
    assert (seen["asimdhp"], seen["asimddp"], seen["bf16"], seen["i8mm"]) == (
        arm.fp16_arithmetic, arm.dotprod, arm.bf16, arm.i8mm)
    assert not seen["sve"] and not seen["sme"]  # no phone-less extras (QEMU's max has both)
    assert seen["cpus"] == arm.machine.cores  # ncnn read the target's /proc/cpuinfo


def _innerproduct(path: Path, weights: list[float]) -> str:
    """64 inputs -> 1 output, bias 1: fed 64 x 250, the exact result is 1 when the weights sum
    to zero, but the fp16 partial sums pass 65504."""
    path.with_suffix(".param").write_text(
        "7767517\n2 2\nInput in 0 1 in 0=64\nInnerProduct ip 1 1 in out 0=1 1=1 2=64\n")
    path.with_suffix(".bin").write_bytes(
        struct.pack("<I64ff", 0, *weights, 1.0))  # tag 0: fp32 weights, then the bias
    return str(path)


@pytest.mark.parametrize("name", ["arm64-v8.2", "arm64-v8.0"])
def test_fp16_arithmetic_overflows_an_innerproduct_only_where_the_cpu_has_it(tmp_path, name):
    halves = _innerproduct(tmp_path / "halves", [250.0] * 32 + [-250.0] * 32)
    alternating = _innerproduct(tmp_path / "alternating", [250.0, -250.0] * 32)
    got = {k: float(v) for k, v in _emulated(name, ["-c", PROBE, halves, alternating]).items()}
    assert got["halves fp16a=False"] == got["alternating fp16a=False"] == 1.0  # fp16 storage
    if name == "arm64-v8.2":
        assert got["halves fp16a=True"] == math.inf
        # ncnn sums 8 lanes: alternating signs give +inf and -inf lanes, added: NaN
        assert math.isnan(got["alternating fp16a=True"])
    else:  # no fp16 arithmetic on this CPU: asking for it computes in fp32
        assert got["halves fp16a=True"] == got["alternating fp16a=True"] == 1.0


def test_missing_pieces_are_a_hinted_error_naming_each(tmp_path, monkeypatch):
    monkeypatch.setenv(ae.ENV_VAR, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no QEMU either
    with pytest.raises(InputError) as err:
        ae.arm_env()
    text = err.value.message
    for piece in ("qemu-aarch64-static", "python3.11", "ncnn's aarch64 wheel",
                  "numpy's aarch64 wheel", "machine description of arm64-v8.0"):
        assert piece in text, piece
    assert "make arm-target" in err.value.hint and ae.ENV_VAR in err.value.hint

    # a half-made folder: only what is absent is named
    monkeypatch.undo()
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "sysroot").symlink_to(ae.arm_env().sysroot)
    monkeypatch.setenv(ae.ENV_VAR, str(partial))
    with pytest.raises(InputError, match="ncnn's aarch64 wheel") as err:
        ae.arm_env()
    assert "python3.11" not in err.value.message and "qemu" not in err.value.message


def test_an_unknown_target_lists_the_known_ones():
    with pytest.raises(InputError, match="arm64-v9") as err:
        ae.target("arm64-v9")
    for name in ("arm64-v8.0", "arm64-v8.2", "arm64-v8.6"):
        assert name in err.value.hint
