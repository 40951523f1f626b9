"""The converter's tools on the command line (issue 33, item 4): `workbench prune`,
`workbench rewriters`, `--rewrite/--no-rewrite` on export and to-ncnn, `export --partition`,
and their bad inputs as hinted errors (exit 2)."""

from __future__ import annotations

import argparse
import json
import textwrap

import pytest

import workbench as wb
from workbench.cli import build_parser, main

NETS = textwrap.dedent("""
    import torch
    import workbench as wb

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.mid = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.head = torch.nn.Conv2d(16, 4, 1)

        def forward(self, x):
            f = wb.mark(torch.relu(self.conv(x)), "feats")
            return self.head(torch.relu(self.mid(f)))

    class Tiled(torch.nn.Module):
        def forward(self, x):
            return x.repeat(1, 2, 1, 1) * 2

    def make():
        torch.manual_seed(0)
        return Net().eval(), (torch.rand(1, 3, 16, 16),)

    def tiled():
        return Tiled(), (torch.rand(1, 3, 4, 4),)

    @wb.rewrite("torch.Tensor.flip", backend="onnxruntime", name="nets.flip")
    def flip(x, dims):
        return x.flip(dims)
""")


@pytest.fixture
def nets(tmp_path):
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    yield path
    if "nets.flip" in {r.name for r in wb.rewriters()}:
        wb.unregister_rewriter("nets.flip")


def test_prune_prints_the_figures_and_as_json_the_notes(nets, tmp_path, capsys):
    rc = main(["prune", f"{nets}:make", "--amount", "0.5", "--method", "l1-structured",
               "--backends", "onnxruntime", "--repeat", "3", "--out", str(tmp_path / "ws")])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert "PruneReport: l1-structured, round_to=8, amount 50%" in out.out
    assert "ONNX file (bytes)" in out.out and "ONNX Runtime latency (ms)" in out.out
    assert "prune" in out.err  # the progress bar, on stderr
    rc = main(["prune", f"{nets}:make", "--amount", "0.5", "--method", "l1-unstructured",
               "--backends", "none", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["ok"] and data["method"] == "l1-unstructured"
    assert [f["figure"] for f in data["figures"]] == ["parameters", "MACs"]
    assert any("zeroes weights but keeps every one" in n for n in data["notes"])


@pytest.mark.parametrize("argv, expected", [
    (["--amount", "1.5"], "amount=1.5 is outside [0, 1)"),
    (["--amount", "0.5", "--method", "l1-structurd"], "did you mean method='l1-structured'?"),
])
def test_prune_bad_amount_and_method_are_hinted(nets, capsys, argv, expected):
    assert main(["prune", f"{nets}:make", "--backends", "none", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and "hint:" in err and "Traceback" not in err


def test_a_model_file_that_does_not_exist_is_named(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "nets.py"
    for argv in (["prune", f"{missing}:make", "--amount", "0.5"],
                 ["export", f"{missing}:make", "--input", "1x3x8x8"],
                 ["rewriters", f"{missing}:make"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"the file '{missing}' does not exist" in err and "hint:" in err, err


def test_rewriters_lists_what_applies_and_export_records_what_fired(nets, tmp_path, capsys):
    assert main(["rewriters", f"{nets}:make", "--backend", "ncnn", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rewriters"]}
    assert rows["workbench.repeat"]["applies"] and rows["workbench.repeat"]["shipped"]
    assert not rows["nets.flip"]["applies"] and rows["nets.flip"]["backend"] == "onnxruntime"
    assert rows["workbench.strided_slice"]["off"]  # shipped, off by default: said so
    assert main(["rewriters", "--backend", "ncnn"]) == 0
    assert "off       workbench.strided_slice" in capsys.readouterr().out

    ws = str(tmp_path / "ws")
    assert main(["export", f"{nets}:tiled", "--backend", "ncnn", "--out", ws, "--json"]) == 0
    (art,) = json.loads(capsys.readouterr().out)["artifacts"]
    assert [(r["name"], r["calls"]) for r in art["rewrites"]] == [("workbench.repeat", 1)]
    assert main(["export", f"{nets}:tiled", "--backend", "ncnn", "--no-rewrite",
                 "--out", ws]) == 0
    assert "rewriter fired" not in capsys.readouterr().out
    assert main(["export", f"{nets}:tiled", "--backend", "ncnn", "--out", ws]) == 0
    assert "rewriter fired: workbench.repeat  function torch.Tensor.repeat" in \
        capsys.readouterr().out
    args = build_parser().parse_args(["to-ncnn", "m.onnx", "--no-rewrite"])
    assert args.rewrite is False


def test_export_partition_exports_each_part_and_checks_the_chain(nets, tmp_path, capsys):
    ws = str(tmp_path / "ws")
    rc = main(["export", f"{nets}:make", "--partition", "feats", "--out", ws, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["ok"] and data["cuts"] == [["feats"]]
    assert [(p["inputs"], p["outputs"]) for p in data["parts"]] == [
        (["input"], ["feats"]), (["feats"], ["output"])]
    assert all(set(p["artifacts"]) == {"onnxruntime"} for p in data["parts"])
    assert main(["export", f"{nets}:make", "--partition", "feets", "--out", ws]) == 2
    err = capsys.readouterr().err
    assert "no wb.mark('feets') is reached" in err and "did you mean 'feats'?" in err


def test_the_new_commands_have_help_with_examples():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("prune", "rewriters"):
        text = sub.choices[name].format_help()
        assert "examples:" in text and f"workbench {name}" in text and "--json" in text
    export = sub.choices["export"].format_help()
    assert "--partition" in export and "--no-rewrite" in export
