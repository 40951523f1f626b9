"""The `workbench` command on an ARM target (ncnn's aarch64 build under QEMU user mode, set up
by ``make arm-target``): ``to-ncnn --target`` checks the converted model there, ``compare
--target --precision`` runs the ncnn candidates there, ``featmask`` writes the per-layer fix;
bad targets and a missing ARM environment are hinted errors with exit code 2. One tiny model
(an InnerProduct whose fp16 accumulation overflows on ARMv8.2); the emulated worker is started
once for the module (every command runs in this process)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from workbench.cli import build_parser, main

NETS = textwrap.dedent("""
    import torch

    class Probe(torch.nn.Module):
        # 64 inputs of 250, weights +-250: exactly the bias (1), while fp16 partial sums
        # pass 65504 on a CPU with fp16 arithmetic
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 1)
            with torch.no_grad():
                w = torch.full((1, 64), 250.0)
                w[0, 1::2] = -250.0
                self.fc.weight.copy_(w)
                self.fc.bias.fill_(1.0)

        def forward(self, x):
            return self.fc(x)

    def probe():
        return Probe().eval(), (torch.full((64,), 250.0),)
""")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The probe converted with `to-ncnn --target arm64-v8.2 --json`: (nets file, workspace,
    exit code, JSON)."""
    tmp = tmp_path_factory.mktemp("cli-arm")
    nets = tmp / "nets.py"
    nets.write_text(NETS)
    ws = tmp / "ws"
    rc = main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.2",
               "--json"])
    return nets, ws, rc


def _json_out(capsys):
    return json.loads(capsys.readouterr().out)


def test_to_ncnn_target_checks_each_precision_on_the_target(converted, capsys):
    nets, ws, _ = converted
    rc = main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.2",
               "--json"])
    out = _json_out(capsys)
    # fp16 arithmetic overflows on ARMv8.2: the check fails there, exit 1 (a CI gate)
    assert rc == 1 and not out["ok"] and out["target"] == "arm64-v8.2"
    assert "ARMv8.2" in out["stands_for"]
    assert out["artifacts"][0]["ok"]  # this machine's check passed
    fp32, fp16 = out["target_runs"]
    assert (fp32["precision"], fp32["flags"], fp32["ok"]) == ("fp32", "fp32", True)
    assert fp32["max_abs"] == 0.0 and fp32["atol"] == 1e-4
    assert (fp16["precision"], fp16["flags"], fp16["ok"]) == ("fp16", "fp16 arithmetic", False)
    assert fp16["nonfinite"] == 1 and fp16["max_abs"] is None and "fp16_unsafe" in fp16["hint"]
    assert fp16["atol"] == 1e-2  # judged by fp16's tolerance
    # text: what ran where, the verdicts and the hint; fp32 alone passes: exit 0
    rc = main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.2"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "on arm64-v8.2 (an ARMv8.2 phone" in text and "not a phone's" in text
    assert "arm64-v8.2: fp16 (ran as fp16 arithmetic): max abs inf" in text
    assert "FAILED" in text and "hint: inf/NaN under fp16 arithmetic" in text
    assert main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.2",
                 "--precision", "fp32,fp16-storage"]) == 0
    text = capsys.readouterr().out
    assert "arm64-v8.2: fp32: max abs 0 " in text and "fp16-storage (ran as fp16 storage)" in text


def test_to_ncnn_on_an_armv8_0_target_says_what_runs_instead(converted, capsys):
    nets, ws, _ = converted
    assert main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.0",
                 "--precision", "fp16", "--json"]) == 0
    (run,) = _json_out(capsys)["target_runs"]
    assert run["flags"] == "fp16 storage" and run["ok"] and run["max_abs"] == 0.0
    assert [n["code"] for n in run["notes"]] == ["fp16-arithmetic-unavailable"]


def test_compare_target_runs_the_ncnn_candidates_there_and_featmask_fixes_it(converted,
                                                                               capsys):
    nets, ws, rc = converted
    assert rc == 1
    param = str(next(ws.glob("*-ncnn/model.ncnn.param")))
    rc = main(["compare", f"{nets}:probe", param, "--target", "arm64-v8.2",
               "--precision", "fp32,fp16", "--mode", "both", "--json"])
    out = _json_out(capsys)
    assert rc == 1 and not out["ok"]
    names = list(out["verdicts"])
    assert any(n.startswith("ncnn fp32 arm64-v8.2") for n in names)
    bad = next(n for n in names if n.startswith("ncnn fp16 arithmetic arm64-v8.2"))
    assert not out["verdicts"][bad]["ok"]
    assert out["first_divergence"]["reference"] == "fc"
    # the fix: ncnn's per-layer mask on that layer; fp16 arithmetic on ARM is exact again
    assert main(["featmask", param, "--layers", "linear_0", "--fp16-arithmetic", "off",
                 "--json"]) == 0
    (child,) = _json_out(capsys)["artifacts"]
    assert child["stage"] == "featmask" and child["ok"]
    assert main(["compare", f"{nets}:probe", child["path"], "--target", "arm64-v8.2",
                 "--precision", "fp16", "--json"]) == 0
    fixed = _json_out(capsys)
    assert fixed["ok"] and list(fixed["verdicts"])[0].startswith("ncnn fp16 arithmetic")
    # --precision alone: the ncnn candidates on this machine in that precision
    assert main(["compare", f"{nets}:probe", param, "--precision", "fp16-storage",
                 "--json"]) == 0
    assert list(_json_out(capsys)["verdicts"])[0].startswith("ncnn fp16-storage ")


def test_bad_targets_and_inputs_are_hinted_errors_exit_2(converted, capsys, tmp_path,
                                                        monkeypatch):
    nets, ws, _ = converted
    param = str(next(ws.glob("*-ncnn/model.ncnn.param")))
    before = sorted(p.name for p in ws.iterdir())
    for argv in (["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v9"],
                 ["compare", f"{nets}:probe", param, "--target", "arm64-v9"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error: unknown ARM target 'arm64-v9'" in err
        assert "hint: use one of: 'arm64-v8.0'" in err and "Traceback" not in err
    assert sorted(p.name for p in ws.iterdir()) == before  # refused before converting
    assert main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--target", "arm64-v8.2",
                 "--precision", "fp8", "--json"]) == 2
    assert "precision='fp8'" in _json_out(capsys)["error"]["message"]
    assert main(["to-ncnn", f"{nets}:probe", "--out", str(ws), "--precision", "fp16"]) == 2
    assert "chooses what runs on an ARM --target" in capsys.readouterr().err
    assert main(["compare", f"{nets}:probe", str(tmp_path / "x.onnx"), "--target",
                 "arm64-v8.2"]) == 2
    assert "apply to ncnn candidates" in capsys.readouterr().err
    # featmask: nothing turned off, an unknown layer
    assert main(["featmask", param, "--layers", "linear_0"]) == 2
    assert "no feature turned off" in capsys.readouterr().err
    assert main(["featmask", param, "--layers", "nope", "--fp16-arithmetic", "off"]) == 2
    assert "layer 'nope' is not in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["featmask", param, "--layers", "linear_0", "--fp16-arithmetic", "maybe"])
    assert e.value.code == 2 and "expected off" in capsys.readouterr().err
    # no ARM environment: the make target that installs it
    monkeypatch.setenv("WORKBENCH_ARM64", str(tmp_path / "nothing"))
    assert main(["compare", f"{nets}:probe", param, "--target", "arm64-v8.2"]) == 2
    err = capsys.readouterr().err
    assert "the ARM target is not installed" in err and "make arm-target" in err


def test_the_console_script_prints_no_traceback_for_an_unknown_target(converted):
    nets, ws, _ = converted
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "to-ncnn", f"{nets}:probe",
                           "--out", str(ws), "--target", "pixel-9"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown ARM target 'pixel-9'" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_names_the_targets_and_featmask_has_examples():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("to-ncnn", "compare", "sweep"):
        text = sub.choices[name].format_help()
        assert "--target" in text and "arm64-v8.2" in text, name
    assert "fp16-storage" in sub.choices["compare"].format_help()
    text = sub.choices["featmask"].format_help()
    assert "examples:" in text and "workbench featmask" in text and "--fp16-arithmetic" in text
