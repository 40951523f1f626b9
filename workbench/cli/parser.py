"""The ``workbench`` command line: every command's arguments, help and examples."""

from __future__ import annotations

import argparse
from typing import Any

from .commands import (
    cmd_demo,
    cmd_export,
    cmd_inspect,
    cmd_quantize,
    cmd_raise,
    cmd_report,
    cmd_simplify,
    cmd_sweep,
)
from .common import _dynamic, _shape
from .converter import cmd_prune, cmd_rewriters, round_to
from .ncnn import cmd_compare, cmd_featmask, cmd_to_ncnn

DESCRIPTION = """The ``workbench`` command: the engine headless, for scripts and CI. Every command
takes ``--json``; the exit code is 0 when all passed, 1 when a check, a tolerance or a sweep
cell failed (a CI gate), 2 on bad input, 130 on Ctrl-C."""


EXAMPLES = {
    "demo": "  workbench demo --workspace runs/demo",
    "inspect": "  workbench inspect model.onnx --json",
    "export": "  workbench export mypkg.nets:make_net --input 1x3x224x224 --simplify\n"
              "  workbench export nets.py:make --input 1x3x64x64 --dynamic input:0=batch --json\n"
              "  workbench export nets.py:detector --backend ncnn --no-rewrite\n"
              "  workbench export nets.py:detector --partition backbone_out,head "
              "--backend ncnn",
    "simplify": "  workbench simplify runs/x/0001-export/model.onnx --backend onnxsim\n"
                "  workbench simplify model.onnx --json || echo 'numbers changed'",
    "raise": "  workbench raise model.onnx --rules GELU,LayerNorm --opset 23",
    "to-ncnn": "  workbench to-ncnn model.onnx --fp16\n"
               "  workbench to-ncnn mypkg.nets:make_net --input 1x3x224x224 --json\n"
               "  workbench to-ncnn nets.py:make --no-rewrite\n"
               "  workbench to-ncnn mypkg.nets:make_net --target arm64-v8.2 "
               "--precision fp32,fp16",
    "compare": "  workbench compare mypkg.nets:make_net model.onnx model.ncnn.param "
               "--input 1x3x224x224\n"
               "  workbench compare workbench.zoo:vit vit.onnx --atol 1e-4 --rtol 1e-3 --json\n"
               "  workbench compare mypkg.nets:make_net model.ncnn.param --target arm64-v8.2 "
               "--precision fp16 --mode both",
    "featmask": "  workbench featmask runs/x/0003-ncnn/model.ncnn.param --layers linear_0 "
                "--fp16-arithmetic off\n"
                "  workbench featmask model.ncnn.param --layers conv_1,conv_2 --bf16 off --json",
    "sweep": "  workbench sweep resnet vit --exporter torchscript,dynamo --ncnn fp32,fp16\n"
             "  workbench sweep resnet --precision fp32,int8\n"
             "  workbench sweep resnet --target none,arm64-v8.2 --ncnn fp32,fp16\n"
             "  workbench sweep mypkg.nets:a mypkg.nets:b --workspace runs/nightly "
             "--report report.html\n"
             "  workbench sweep --scheduler tcp://10.0.0.5:8786 --shared /mnt/runs/zoo\n"
             "  workbench sweep --workspace runs/nightly --retry-failed",
    "quantize": "  workbench quantize model.onnx --calibration samples/ --method percentile\n"
                "  workbench quantize runs/x/0003-ncnn/model.ncnn.param --calibration "
                "images/ --exclude conv_3 --json\n"
                "  workbench quantize bert.onnx --dynamic",
    "prune": "  workbench prune mypkg.nets:make_net --input 1x3x224x224 --amount 0.5 "
             "--method l1-structured\n"
             "  workbench prune resnet --amount 0.3 --method l1-unstructured --json\n"
             "  workbench prune nets.py:make --amount 0.5 --round-to none --backends ncnn "
             "--save pruned.pt",
    "rewriters": "  workbench rewriters --backend ncnn\n"
                 "  workbench rewriters nets.py:make --backend onnxruntime --exporter dynamo "
                 "--json",
    "report": "  workbench report runs/nightly -o report.html\n"
              "  workbench report runs/nightly -o diff.html --against runs/last-week",
}


def _sub(sub: Any, name: str, help_text: str, func: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text,
                       epilog="examples:\n" + EXAMPLES[name],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=func)
    return p


def _inputs_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--input", type=_shape, action="append", required=required,
                   help="example input shape, e.g. 1x3x224x224 (repeat for several inputs; "
                   "not needed when the factory returns (model, inputs))")
    p.add_argument("--dtype", default="float32")


def _off(text: str) -> bool | None:
    """--fp16-arithmetic off -> False (the feature masked off); on -> None (left as it is)."""
    word = text.strip().lower()
    if word in ("off", "false", "no", "0"):
        return False
    if word in ("on", "true", "yes", "1"):
        return None
    raise argparse.ArgumentTypeError(f"{text!r}: expected off (or on: leave the feature as "
                                     "the net's options set it)")


def _target_flags(p: argparse.ArgumentParser, precision_help: str) -> None:
    p.add_argument("--target", default=None, help="run ncnn on an ARM target: arm64-v8.0, "
                   "arm64-v8.2 (fp16 arithmetic), arm64-v8.6 (bf16, i8mm): ncnn's own aarch64 "
                   "build under QEMU user mode (set up by `make arm-target`; emulated time is "
                   "not phone time); default: this machine")
    p.add_argument("--precision", default=None, help=precision_help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench", description=DESCRIPTION,
        epilog="examples:\n" + "\n".join(EXAMPLES[k] for k in ("demo", "export", "compare",
                                                               "sweep", "report")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_inspect(sub)
    _add_export(sub)
    _add_simplify(sub)
    _add_raise(sub)
    _add_to_ncnn(sub)
    _add_prune(sub)
    _add_rewriters(sub)
    _add_quantize(sub)
    _add_compare(sub)
    _add_featmask(sub)
    _add_sweep(sub)
    _add_report(sub)
    return p


def _add_demo(sub: Any) -> None:
    d = _sub(sub, "demo", "run the default super-resolution model through every stage",
             cmd_demo)
    d.add_argument("--workspace", default=None, help="folder for artifacts "
                   "(default ./workbench-runs/default)")
    d.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])


def _add_inspect(sub: Any) -> None:
    i = _sub(sub, "inspect", "print the graph summary of a model file", cmd_inspect)
    i.add_argument("file")


def _add_export(sub: Any) -> None:
    e = _sub(sub, "export", "export MODULE:FACTORY to ONNX", cmd_export)
    e.add_argument("model", help="MODULE:FACTORY or path/to/file.py:FACTORY returning an "
                   "nn.Module or (model, example_inputs)")
    _inputs_args(e)
    e.add_argument("--opset", type=int, default=17)
    e.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    e.add_argument("--dynamic", type=_dynamic, action="append",
                   help="NAME:AXIS[=DIM] dynamic axis, e.g. input:0=batch (repeatable)")
    e.add_argument("--simplify", action="store_true", help="also run the simplify stage")
    e.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "ncnn"],
                   help="what the ONNX model is for: the rewriters registered for it apply "
                   "during the export (default onnxruntime)")
    _rewrite_flag(e)
    e.add_argument("--partition", default=None, metavar="AT[,AT]",
                   help="cut the model at these points (wb.mark names or submodule names, "
                   "in forward order; a cut of several tensors joined by +) and export each "
                   "part for --backend; parts it cannot take stay in torch; the chain is "
                   "checked against the model (exit 1 when it is off)")
    e.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")


def _rewrite_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rewrite", action=argparse.BooleanOptionalAction, default=True,
                   help="apply the registered rewriters whose conditions match this export "
                   "(wb.rewrite; listed by `workbench rewriters`); --no-rewrite exports the "
                   "model as written (default: --rewrite)")


def _add_simplify(sub: Any) -> None:
    s = _sub(sub, "simplify", "simplify an ONNX file (exit 1 when the numbers change)",
             cmd_simplify)
    s.add_argument("file", help="path to a .onnx file")
    s.add_argument("--backend", default="onnxslim", choices=["onnxslim", "onnxsim", "onnxscript"])
    s.add_argument("--out", default=None, help="workspace folder (default: the input's, or "
                   "./workbench-runs/default)")


def _add_raise(sub: Any) -> None:
    r = _sub(sub, "raise", "raise lowered subgraphs of an ONNX file to high-level ops", cmd_raise)
    r.add_argument("file", help="path to a .onnx file")
    r.add_argument("--rules", default=None, help="comma-separated rule names (default: all)")
    r.add_argument("--target", default="standard", choices=["standard", "functions"])
    r.add_argument("--opset", type=int, default=None, help="upgrade the model's opset first")
    r.add_argument("--out", default=None, help="workspace folder (default ./workbench-runs/default)")


def _add_to_ncnn(sub: Any) -> None:
    n = _sub(sub, "to-ncnn", "convert an ONNX file or MODULE:FACTORY to ncnn through pnnx "
             "(exit 1 when ncnn's numbers differ from torch's)", cmd_to_ncnn)
    n.add_argument("source", help="a .onnx file, or MODULE:FACTORY (traced by pnnx)")
    _inputs_args(n)
    n.add_argument("--fp16", action="store_true", help="store fp16 weights")
    _rewrite_flag(n)
    n.add_argument("--atol", type=float, default=None,
                   help="the check's absolute tolerance (default 1e-4; 1e-2 with --fp16)")
    n.add_argument("--rtol", type=float, default=None,
                   help="its tolerance relative to max |torch| (default 1e-3; 1e-2 with --fp16)")
    n.add_argument("--out", default=None, help="workspace folder")
    _target_flags(n, "with --target: comma-separated ncnn precisions run there, each checked "
                  "against torch: fp32, fp16 (storage, and arithmetic where the CPU has it), "
                  "fp16-storage, bf16 (default fp32,fp16)")


def _add_prune(sub: Any) -> None:
    r = _sub(sub, "prune", "prune MODULE:FACTORY (structured: whole channels; unstructured: "
             "zeroed weights) and measure the pruned model against the unpruned one where it "
             "runs: parameters, MACs, ONNX and ncnn .bin size, ONNX Runtime and ncnn latency, "
             "output change (exit 1 when a backend could not be measured)", cmd_prune)
    r.add_argument("model", help="MODULE:FACTORY, path/to/file.py:FACTORY or a zoo name "
                   "(resnet, mobilenet_v2, ...)")
    _inputs_args(r)
    r.add_argument("--amount", type=float, required=True,
                   help="the fraction of the conv/linear weights to take away, in [0, 1)")
    r.add_argument("--method", default="l1-structured",
                   help="l1-structured (default: channels removed, consistent across residual "
                   "adds and concats) or l1-unstructured (weights zeroed)")
    r.add_argument("--round-to", type=round_to, default=8, metavar="N|none",
                   help="structured: keep every pruned width a multiple of N (default 8: "
                   "the backends' packed kernels); none prunes to the exact ratio")
    r.add_argument("--ignore", action="append", help="a layer to leave whole, by its name "
                   "in model.named_modules() (repeatable)")
    r.add_argument("--backends", default="onnxruntime,ncnn",
                   help="comma-separated backends to export, weigh and time (none: torch "
                   "figures only)")
    r.add_argument("--threads", type=int, default=1, help="intra-op threads of both backends")
    r.add_argument("--repeat", type=int, default=15, help="timed alternating rounds")
    r.add_argument("--save", default=None, help="also torch.save the pruned module here")
    r.add_argument("--out", default=None, help="workspace folder for the four models")


def _add_rewriters(sub: Any) -> None:
    w = _sub(sub, "rewriters", "list the registered rewriters (code replaced during export "
             "only, for one backend) and whether each applies to an export", cmd_rewriters)
    w.add_argument("model", nargs="?", default=None, help="optional MODULE:FACTORY whose "
                   "module registers rewriters when imported (the factory is not called)")
    w.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "ncnn"])
    w.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    w.add_argument("--opset", type=int, default=17)


def _add_quantize(sub: Any) -> None:
    q = _sub(sub, "quantize", "quantize an ONNX file (ONNX Runtime) or an ncnn model to int8, "
             "calibrated on a folder of .npy files or images (exit 1 when its checks fail)",
             cmd_quantize)
    q.add_argument("file", help="a .onnx file, or the model.ncnn.param of a to-ncnn artifact")
    q.add_argument("--calibration", default=None,
                   help="folder of .npy files (one sample each) or images")
    q.add_argument("--backend", default=None, choices=["onnxruntime", "ncnn"],
                   help="default: the one the file runs on")
    q.add_argument("--method", default=None,
                   help="onnxruntime: minmax (default), entropy, percentile; ncnn: kl "
                   "(default), aciq, minmax")
    q.add_argument("--exclude", action="append", help="a node or layer to keep in float "
                   "(repeatable)")
    q.add_argument("--dynamic", action="store_true", help="onnxruntime dynamic quantization of "
                   "MatMul/Gemm weights (no calibration)")
    q.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor "
                   "(onnxruntime; default per channel)")
    q.add_argument("--limit", type=int, default=64, help="at most N calibration samples")
    q.add_argument("--seed", type=int, default=0, help="the seed that picks them")
    q.add_argument("--out", default=None, help="workspace folder for an imported .onnx file")


def _add_compare(sub: Any) -> None:
    c = _sub(sub, "compare", "compare candidates with the torch model op by op "
             "(exit 1 when a tolerance fails)", cmd_compare)
    c.add_argument("model", help="MODULE:FACTORY: the torch reference")
    c.add_argument("candidates", nargs="+", help=".onnx / .ncnn.param files")
    _inputs_args(c)
    c.add_argument("--mode", default="accumulated", choices=["accumulated", "isolated", "both"])
    c.add_argument("--atol", type=float, default=None)
    c.add_argument("--rtol", type=float, default=None)
    c.add_argument("--table", action="store_true", help="also print every row (CSV)")
    _target_flags(c, "the ncnn candidates' precision: fp32 (default), fp16 (storage, and "
                  "arithmetic where the CPU has it), fp16-storage, bf16; comma-separated: "
                  "each ncnn candidate once per precision")


def _add_featmask(sub: Any) -> None:
    f = _sub(sub, "featmask", "turn ncnn features off on named layers (ncnn's per-layer 31= "
             "mask) in a child ncnn artifact: the fix for a layer whose fp16 arithmetic "
             "overflows on an ARM phone, fp16 kept everywhere else", cmd_featmask)
    f.add_argument("file", help="a model.ncnn.param (of a to-ncnn, quantize or featmask "
                   "artifact, or with its .ncnn.bin beside it)")
    f.add_argument("--layers", required=True, help="comma-separated ncnn layer names (the "
                   ".param's second column; compare's rep.fp16_unsafe().layers)")
    for flag, what in (("fp16-arithmetic", "fp16 arithmetic (bit 0)"),
                       ("fp16-storage", "fp16 storage and packing (bit 1)"),
                       ("bf16", "bf16 storage (bit 2)"),
                       ("int8", "int8 (bit 3; read by ncnn's Vulkan layers only)")):
        f.add_argument(f"--{flag}", type=_off, default=None, metavar="off",
                       help=f"off: no {what} in these layers")
    f.add_argument("--out", default=None, help="workspace folder (default: the model's)")


def _add_sweep(sub: Any) -> None:
    w = _sub(sub, "sweep", "every model through every stage under a matrix of choices, in "
             "fresh processes, locally or on a Dask cluster; results in WORKSPACE/sweep.db; a "
             "re-run resumes (exit 1 when a cell fails)", cmd_sweep)
    w.add_argument("models", nargs="*", help="MODULE:FACTORY, path/file.py:FACTORY or zoo "
                   "names (default: the project's zoo); each factory returns "
                   "(model, example_inputs)")
    w.add_argument("--exporter", help="comma-separated: torchscript,dynamo")
    w.add_argument("--opset", help="comma-separated opsets, e.g. 13,17 (default: the exporter's)")
    w.add_argument("--simplify", help="comma-separated: onnxslim,onnxsim,onnxscript,none")
    w.add_argument("--raise", dest="raise_", help="comma-separated: on,off")
    w.add_argument("--ncnn", help="comma-separated: fp32,fp16,fp16-storage,none (the weights "
                   "written; on an ARM --target also the precision ncnn runs there: fp16 is "
                   "fp16 storage and arithmetic where the CPU has it)")
    w.add_argument("--target", help="comma-separated: none (this machine), arm64-v8.0, "
                   "arm64-v8.2, arm64-v8.6: the ncnn candidates run there (ncnn's aarch64 "
                   "build under QEMU, `make arm-target`)")
    w.add_argument("--precision", help="comma-separated: fp32,int8 (int8: wb.quantize on ONNX "
                   "Runtime and ncnn, calibrated on 4 seeded samples; int8-onnxruntime or "
                   "int8-ncnn for one backend)")
    w.add_argument("--workspace", default=None, help="the sweep's folder (default "
                   "./workbench-runs/sweep)")
    w.add_argument("--workers", type=int, default=None, help="cells at a time on this machine "
                   "(default: one per core; 1: serial)")
    w.add_argument("--scheduler", default=None, help="a Dask scheduler, e.g. tcp://host:8786")
    w.add_argument("--shared", default=None, help="a folder every Dask worker can write: "
                   "artifacts stay there instead of coming back to the workspace")
    w.add_argument("--retry-failed", action="store_true", help="run failed cells again")
    w.add_argument("--connect-timeout", type=float, default=5.0,
                   help="seconds to wait for --scheduler (default 5)")
    w.add_argument("--cell-timeout", type=float, default=1800.0,
                   help="seconds one cell may take (default 1800)")
    w.add_argument("--report", default=None, help="also write the HTML report here")


def _add_report(sub: Any) -> None:
    o = _sub(sub, "report", "write a sweep's HTML report (one self-contained file)", cmd_report)
    o.add_argument("workspace", help="the sweep's folder (holds sweep.db)")
    o.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    o.add_argument("--against", default=None, help="an earlier sweep's folder: show what "
                   "broke or improved since")
