"""Damaged ncnn models: .ncnn.param text edited or truncated, .ncnn.bin cut, grown, swapped.

The base model (tiny: Input, Convolution+ReLU, Convolution+Sigmoid) goes through
``NcnnRunner(path).run``. Right is a hinted refusal or the original output; a run that returns
anything else is silent wrong. Same-size weight damage cannot be seen from a bare path, so
those cases go through the workspace artifact, whose files carry a sha256.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .actions import Action, Context, close, first, run_ncnn
from .harness import Case


def _lines(ctx: Context) -> list[str]:
    return ctx.model("tiny.ncnn.param").read_text().splitlines()


def _sub(lines: list[str], i: int, old: str, new: str) -> list[str]:
    lines[i] = lines[i].replace(old, new, 1)
    return lines


P = Callable[[list[str]], list[str]]
PARAM_EDITS: dict[str, P] = {
    "magic_wrong": lambda ls: ["7767518", *ls[1:]],
    "magic_missing": lambda ls: ls[1:],
    "layer_count_small": lambda ls: [ls[0], "2 3", *ls[2:]],
    "layer_count_large": lambda ls: [ls[0], "4 3", *ls[2:]],
    "layer_count_zero": lambda ls: [ls[0], "0 3", *ls[2:]],
    "layer_count_negative": lambda ls: [ls[0], "-1 3", *ls[2:]],
    "layer_count_huge": lambda ls: [ls[0], "99999999 3", *ls[2:]],
    "blob_count_small": lambda ls: [ls[0], "3 2", *ls[2:]],
    "blob_count_large": lambda ls: [ls[0], "3 9", *ls[2:]],
    "blob_count_zero": lambda ls: [ls[0], "3 0", *ls[2:]],
    "counts_missing": lambda ls: [ls[0], *ls[2:]],
    "unknown_layer_type": lambda ls: _sub(ls, 3, "Convolution", "Convolutionx"),
    "drop_last_layer": lambda ls: ls[:-1],
    "drop_middle_layer": lambda ls: ls[:3] + ls[4:],
    "duplicate_layer": lambda ls: ls[:4] + [ls[3]] + ls[4:],
    "colliding_blob_names": lambda ls: _sub(ls, 4, " out0 ", " 1 "),
    "output_into_input_name": lambda ls: _sub(ls, 4, " out0 ", " in0 "),
    "output_renamed": lambda ls: _sub(ls, 4, " out0 ", " outX "),
    "input_renamed": lambda ls: _sub(_sub(ls, 2, " in0", " inX"), 2, " in0", " inX"),
    "ghost_input_blob": lambda ls: _sub(ls, 4, " 1 out0", " ghost out0"),
    "self_loop": lambda ls: _sub(ls, 4, " 1 out0", " out0 out0"),
    "num_output_changed": lambda ls: _sub(ls, 3, " 0=8 ", " 0=9 "),
    "weight_size_changed": lambda ls: _sub(ls, 3, " 6=216", " 6=215"),
    "kernel_changed": lambda ls: _sub(_sub(ls, 3, " 1=3 ", " 1=5 "), 3, " 11=3 ", " 11=5 "),
    "bias_term_off": lambda ls: _sub(ls, 3, " 5=1 ", " 5=0 "),
    "param_value_nan": lambda ls: _sub(ls, 3, " 0=8 ", " 0=nan "),
    "negative_kernel": lambda ls: _sub(ls, 3, " 1=3 ", " 1=-3 "),
    "garbage_key": lambda ls: _sub(ls, 3, " 0=8 ", " abc=8 0=8 "),
    "bad_array_param": lambda ls: [*ls[:3], ls[3] + " -23303=5,1,2"],
    "too_many_bottoms": lambda ls: _sub(ls, 3, " 1 1 in0 1 ", " 2 1 in0 1 "),
    "zero_tops": lambda ls: _sub(ls, 3, " 1 1 in0 1 ", " 1 0 in0 1 "),
    "only_magic": lambda ls: ls[:1],
    "empty": lambda ls: [],
    "crlf": lambda ls: ["\r\n".join(ls)],
    "tabs": lambda ls: [" ".join(x.split()).replace(" ", "\t") for x in ls],
    "long_line": lambda ls: [*ls[:3], ls[3] + " " * (1 << 20) + "7=1", *ls[4:]],
    "unicode_layer_name": lambda ls: _sub(ls, 3, "convrelu_0", "卷积_0"),
    # layers ncnn loads but cannot run on a 16x16 input (issue 17 item 7: the layer named)
    "pool_kernel_larger": lambda ls: _append(ls, "Pooling pool_0 1 1 2 out0 0=1 1=32 11=32 "
                                             "2=1 12=1 5=1"),
    "reshape_huge": lambda ls: _append(ls, "Reshape reshape_0 1 1 2 out0 0=100000 1=100000 "
                                       "2=1000"),
}


def _append(lines: list[str], layer: str) -> list[str]:
    """``layer`` after the last one, fed by it (its output renamed), counts raised by one."""
    layers, blobs = (int(n) for n in lines[1].split())
    last = lines[-1].replace(" out0 ", " 2 ", 1)
    return [lines[0], f"{layers + 1} {blobs + 1}", *lines[2:-1], last, layer]
PARAM_EXPECT = {"crlf": "either", "tabs": "either", "unicode_layer_name": "either",
                "garbage_key": "either", "blob_count_large": "either"}


def _copy_model(ctx: Context, name: str = "tiny") -> Any:
    param = ctx.copy_in(f"{name}.ncnn.param", "m.ncnn.param")
    ctx.copy_in(f"{name}.ncnn.bin", "m.ncnn.bin")
    ctx.copy_in(f"{name}_ncnn.py", "m_ncnn.py")
    return param


def _param_edit(ctx: Context) -> Action:
    param = _copy_model(ctx)
    text = "\n".join(PARAM_EDITS[ctx.p["edit"]](_lines(ctx)))
    param.write_bytes(text.encode() + (b"\n" if text else b""))
    return lambda: run_ncnn(param, ctx)


def _param_trunc(ctx: Context) -> Action:
    param = _copy_model(ctx)
    data = param.read_bytes()
    param.write_bytes(data[: int(len(data) * ctx.p["frac"])])
    return lambda: run_ncnn(param, ctx)


def _param_garbage(ctx: Context) -> Action:
    param = _copy_model(ctx)
    rng = np.random.default_rng(ctx.p["seed"])
    param.write_bytes(rng.integers(0, 256, ctx.p["size"], dtype=np.uint8).tobytes())
    return lambda: run_ncnn(param, ctx)


def _bin_edit(ctx: Context) -> Action:
    param = _copy_model(ctx)
    b = ctx.inp / "m.ncnn.bin"
    data = b.read_bytes()
    how, n = ctx.p["how"], ctx.p.get("n", 0)
    if how == "cut":
        b.write_bytes(data[: n if n >= 0 else len(data) + n])
    elif how == "grow":
        b.write_bytes(data + b"\0" * n)
    elif how == "other_model":
        b.write_bytes(ctx.model(f"{ctx.p['other']}.ncnn.bin").read_bytes())
    elif how == "fp16_tag":
        b.write_bytes(bytes.fromhex("476b3001") + data[4:])
    elif how == "missing":
        b.unlink()
    elif how == "folder":
        b.unlink()
        b.mkdir()
    elif how == "dev_zero":
        b.unlink()
        os.symlink("/dev/zero", b)
    elif how == "param_folder":
        param.unlink()
        param.mkdir()
    elif how == "py_garbage":
        (ctx.inp / "m_ncnn.py").write_text("def test_inference(:\n  ex.input('in0'\n")
    elif how == "py_missing":
        (ctx.inp / "m_ncnn.py").unlink()
    return lambda: run_ncnn(param, ctx)


def _artifact_damage(ctx: Context) -> Action:
    """Damage a file of the workspace's ncnn (or ONNX) artifact, then run the artifact."""
    from .actions import input_name

    key = ctx.p["artifact"]
    path = ctx.ws_artifact_path(key)
    target = path if ctx.p["file"] == "main" else path.with_name(
        path.name[: -len(".param")] + ".bin")
    data = bytearray(target.read_bytes())
    if ctx.p["how"] == "other_model":
        data = bytearray(ctx.model("other.ncnn.bin").read_bytes())
    else:
        for frac, bit in ctx.p["flips"]:
            data[int(len(data) * frac) % len(data)] ^= 1 << bit
    target.write_bytes(bytes(data))

    def act() -> tuple[str, str]:
        from workbench.runtime import NcnnRunner, OrtRunner

        art = ctx.ws.get(ctx.index[key])
        x, y = ctx.ref("tiny")
        if key == "ncnn_id":
            return close(first(NcnnRunner(art).run((x,))), y, atol=1e-3, what="ncnn output")
        return close(first(OrtRunner(art).run({input_name("tiny"): x})), y, what="ort output")
    return act


KINDS = {"ncnn_param_edit": _param_edit, "ncnn_param_trunc": _param_trunc,
         "ncnn_param_garbage": _param_garbage, "ncnn_bin": _bin_edit,
         "artifact_damage": _artifact_damage}

BIN_EDITS: list[tuple[str, dict[str, Any], str]] = [
    ("cut-empty", {"how": "cut", "n": 0}, "error"), ("cut-4", {"how": "cut", "n": 4}, "error"),
    ("cut-half", {"how": "cut", "n": 1000}, "error"), ("cut-minus4", {"how": "cut", "n": -4}, "error"),
    ("cut-minus1", {"how": "cut", "n": -1}, "error"), ("grow-1", {"how": "grow", "n": 1}, "error"),
    ("grow-4", {"how": "grow", "n": 4}, "error"), ("grow-4096", {"how": "grow", "n": 4096}, "error"),
    ("wide-model", {"how": "other_model", "other": "wide"}, "error"),
    ("fp16-tag", {"how": "fp16_tag"}, "error"), ("missing", {"how": "missing"}, "error"),
    ("folder", {"how": "folder"}, "error"), ("dev-zero", {"how": "dev_zero"}, "error"),
    ("param-folder", {"how": "param_folder"}, "error"),
    ("py-garbage", {"how": "py_garbage"}, "either"), ("py-missing", {"how": "py_missing"}, "either"),
]


def cases(rng: np.random.Generator) -> list[Case]:
    out = [Case(f"ncnn_param-{name}", "ncnn_param", "ncnn_param_edit", {"edit": name},
                expect=PARAM_EXPECT.get(name, "error")) for name in PARAM_EDITS]
    for i, frac in enumerate(sorted(round(float(f), 3) for f in rng.uniform(0.05, 0.97, 8))):
        out.append(Case(f"ncnn_param-trunc-{i}", "ncnn_param", "ncnn_param_trunc", {"frac": frac}))
    for i, size in enumerate((16, 300, 5000)):
        out.append(Case(f"ncnn_param-garbage-{i}", "ncnn_param", "ncnn_param_garbage",
                        {"seed": int(rng.integers(1 << 30)), "size": size}))
    out += [Case(f"ncnn_bin-{name}", "ncnn_bin", "ncnn_bin", params, expect=expect)
            for name, params, expect in BIN_EDITS]
    out.append(Case("artifact-ncnn-bin-other-model", "artifact_damage", "artifact_damage",
                    {"artifact": "ncnn_id", "file": "bin", "how": "other_model"},
                    damages=["0003-ncnn"]))
    for i in range(4):
        flips = [[round(float(rng.uniform(0.05, 1)), 5), int(rng.integers(0, 8))]]
        out.append(Case(f"artifact-ncnn-bin-flip-{i}", "artifact_damage", "artifact_damage",
                        {"artifact": "ncnn_id", "file": "bin", "how": "flip", "flips": flips},
                        damages=["0003-ncnn"]))
        flips = [[round(float(rng.uniform(0.3, 1)), 5), int(rng.integers(0, 8))]]
        out.append(Case(f"artifact-onnx-flip-{i}", "artifact_damage", "artifact_damage",
                        {"artifact": "onnx_id", "file": "main", "how": "flip", "flips": flips},
                        damages=["0001-export"]))
    return out
