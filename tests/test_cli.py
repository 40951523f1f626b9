"""The `workbench` command: demo, inspect, export, and its errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.cli import main


def test_demo_prints_the_stage_table(tmp_path, capsys):
    rc = main(["demo", "--workspace", str(tmp_path / "ws")])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0, f"demo exited {rc}:\n{out}\n{captured.err[-3000:]}"
    header = next(line for line in out.splitlines() if line.startswith("stage"))
    assert header.split()[:4] == ["stage", "artifact", "format", "nodes"]
    assert "max abs vs torch" in header and "seconds" in header
    table = out.split("\n\n")[0]  # the op-by-op summary follows a blank line
    rows = {" ".join(line.split()[:2]) if line.startswith("ncnn") else line.split()[0]:
            line.split() for line in table.splitlines()
            if line.startswith(("export ", "simplify ", "raise ", "ncnn "))}
    assert set(rows) == {"export", "simplify", "raise", "ncnn fp32", "ncnn fp16"}
    assert rows["export"][2] == "onnx" and int(rows["simplify"][3]) <= int(rows["export"][3])
    assert float(rows["export"][4]) < 1e-4
    assert rows["ncnn fp32"][3] == "ncnn" and float(rows["ncnn fp32"][5]) < 1e-4
    fp16 = rows["ncnn fp16"][5]  # "-" when ncnn ran no layer in fp16 here (fp16-not-exercised)
    assert fp16 == "-" or float(fp16) < 1e-2
    assert "op by op:" in out and "6/6 aligned" in out
    manifest = json.loads((tmp_path / "ws" / "manifest.json").read_text())
    assert [a["stage"] for a in manifest["artifacts"]] == ["export", "simplify", "raise", "pnnx",
                                                             "ncnn"]


def test_inspect_text_and_json(tmp_path, capsys):
    main(["demo", "--workspace", str(tmp_path / "ws")])
    capsys.readouterr()
    model = next((tmp_path / "ws").glob("*-export/model.onnx"))
    assert main(["inspect", str(model)]) == 0
    text = capsys.readouterr().out
    assert "nodes: 7" in text and "Conv" in text and "input: float32[1x3x64x64]" in text
    assert main(["inspect", str(model), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["node_count"] == 7 and data["op_histogram"]["Conv"] == 3


@pytest.mark.parametrize("content, expected", [
    (b"hello, not a model", "is not an ONNX model"),
    (b"\x08\x08\x12\x07pytorch\x1a", "truncated"),
])
def test_inspect_bad_file_is_a_clear_error(tmp_path, capsys, content, expected):
    f = tmp_path / "bad.onnx"
    f.write_bytes(content)
    assert main(["inspect", str(f)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "hint:" in err


def test_inspect_missing_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_export_from_a_file_factory(tmp_path, capsys):
    src = tmp_path / "nets.py"
    src.write_text(textwrap.dedent("""
        import torch
        def make():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    """))
    rc = main(["export", f"{src}:make", "--input", "1x3x16x16", "--opset", "13",
               "--dynamic", "input:0=batch", "--simplify", "--out", str(tmp_path / "ws")])
    out = capsys.readouterr().out
    assert rc == 0, out
    model = Path(out.strip().splitlines()[-1].removeprefix("model: "))
    assert model.exists() and "simplify" in model.parent.name
    import onnx

    m = onnx.load(str(model))
    assert m.opset_import[0].version == 13
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize("argv, expected", [
    (["export", "nets_without_colon", "--input", "1x3"], "expected MODULE:FACTORY"),
    (["export", "no_such_module_xyz:make", "--input", "1x3"], "cannot import"),
    (["export", "json:no_such_factory", "--input", "1x3"], "has no callable 'no_such_factory'"),
])
def test_export_bad_model_spec(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "hint:" in err


def test_export_bad_shape_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["export", "x:y", "--input", "1xax3"])
    assert e.value.code == 2
    assert "expected sizes joined by x" in capsys.readouterr().err


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "workbench"
    assert exe.exists()
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert all(cmd in out for cmd in ("demo", "inspect", "export"))


@pytest.mark.parametrize("body, expected", [
    ("def make():\n    raise RuntimeError('no weights here')\n",
     "make() raised RuntimeError: no weights here (at "),
    ("x = 1 / 0\ndef make():\n    pass\n", "importing '"),
    ("def make(:\n", "raised SyntaxError"),
])
def test_export_factory_that_raises_is_an_error_not_a_traceback(tmp_path, capsys, body,
                                                                expected):
    src = tmp_path / "broken.py"
    src.write_text(body)
    assert main(["export", f"{src}:make", "--input", "1x3", "--out", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert "hint:" in err


# -- the commands that mirror the engine (issue 19): --json, exit codes for CI, --help ----------
NETS = textwrap.dedent("""
    import torch

    def make(seed=0):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(4, 2, 1))
        return net.eval(), (torch.rand(1, 3, 8, 8),)

    def other():  # the same architecture, other weights
        return make(seed=1)

    def broken():
        raise RuntimeError("no weights")
""")


def test_every_command_has_help_with_examples():
    from workbench.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    commands = ("demo", "inspect", "export", "simplify", "raise", "to-ncnn", "compare", "sweep",
                "report")
    assert all(c in top for c in commands) and "examples:" in top
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in commands:
        text = sub.choices[name].format_help()
        assert "examples:" in text and f"workbench {name}" in text and "--json" in text, name


def test_simplify_to_ncnn_and_compare_as_json_and_a_failed_tolerance_exits_1(tmp_path, capsys):
    nets = tmp_path / "nets.py"
    nets.write_text(NETS)
    ws = str(tmp_path / "ws")
    assert main(["export", f"{nets}:other", "--input", "1x3x8x8", "--out", ws, "--json"]) == 0
    other_onnx = json.loads(capsys.readouterr().out)["artifacts"][0]["path"]
    assert main(["to-ncnn", f"{nets}:make", "--out", ws, "--json"]) == 0
    ncnn = json.loads(capsys.readouterr().out)
    assert ncnn["ok"] and ncnn["artifacts"][0]["format"] == "ncnn"
    assert ncnn["artifacts"][0]["metrics"]["max_abs"] < 1e-4
    # ncnn rounds otherwise than torch: a zero tolerance fails the check, exit 1, a CI gate
    assert main(["to-ncnn", f"{nets}:make", "--out", ws, "--json", "--atol", "0",
                 "--rtol", "0"]) == 1
    strict = json.loads(capsys.readouterr().out)
    assert not strict["ok"] and "ncnn-numeric-mismatch" in json.dumps(strict)
    assert main(["simplify", other_onnx, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)["artifacts"][0]
    assert sim["stage"] == "simplify" and sim["ok"] and sim["nodes"] == 3
    # make's own ncnn model passes; the ONNX of other weights fails: exit 1, a CI gate
    assert main(["compare", f"{nets}:make", ncnn["artifacts"][0]["path"], "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    assert good["ok"] and good["first_divergence"] is None and good["notes"] == {}
    assert main(["compare", f"{nets}:make", other_onnx, "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert not bad["ok"] and bad["first_divergence"]["op_type"] == "Conv"
    assert list(bad["aligned_fraction"].values())[0] > 0.5


def test_sweep_exits_1_when_a_cell_fails_and_prints_json(tmp_path, capsys):
    nets = tmp_path / "nets.py"
    nets.write_text(NETS)
    ws = tmp_path / "ws"
    rc = main(["sweep", f"{nets}:broken", "--workspace", str(ws), "--ncnn", "fp32,none",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and not out["ok"] and out["ran"] == 2
    assert [c["choices"]["ncnn"] for c in out["cells"]] == ["fp32", "none"]
    stage = out["cells"][0]["stages"][0]
    assert stage["status"] == "failed" and "no weights" in stage["error"] and stage["hint"]
    # a bad choice is bad input: exit 2 with a hint, as JSON under --json
    assert main(["sweep", f"{nets}:broken", "--workspace", str(ws), "--ncnn", "int4",
                 "--json"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert "unknown value 'int4'" in err["message"] and err["hint"]
    assert main(["report", str(ws), "-o", str(tmp_path / "r.html")]) == 0
    assert "2 cells, 2 failed" in capsys.readouterr().out


def test_quantize_an_onnx_file_and_an_ncnn_artifact_from_a_folder_of_npy(tmp_path, capsys):
    import numpy as np
    import torch

    import workbench as wb

    model, x = wb.default_model()
    ws = wb.Workspace(tmp_path / "ws")
    onx, nc = wb.export(model, x, workspace=ws), wb.to_ncnn(model, x, workspace=ws)
    samples = tmp_path / "samples"
    samples.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(4):
        np.save(samples / f"{i}.npy", torch.rand(*x[0].shape, generator=g).numpy())
    for path in (onx.path, nc.path):
        code = main(["quantize", str(path), "--calibration", str(samples), "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        (art,) = out["artifacts"]
        assert art["stage"] == "quantize" and art["metrics"]["quantized"] >= 3
        assert 15 < art["metrics"]["min_snr_db_vs_parent"] < 80
    # an ncnn .param outside any workspace cannot be quantized: said, with what to give
    loose = tmp_path / "loose.ncnn.param"
    loose.write_text(nc.path.read_text())
    assert main(["quantize", str(loose), "--calibration", str(samples)]) == 2
    err = capsys.readouterr().err
    assert "not a .onnx file nor inside a workspace artifact" in err and "hint:" in err
