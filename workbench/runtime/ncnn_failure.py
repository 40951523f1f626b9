"""Which ncnn layer failed, on what, and why: the locator behind NcnnRunner's run errors.

ncnn reports a failed run as a bare ``extract(...) returned -100`` (or ``-1``), hands back a
Mat with negative sizes, or aborts the process; its own reason, when it gives one, is a line
on stderr. To name the layer, the model is run again in a probe process of its own (it may
crash there too) one layer at a time, in the ``.param``'s order, from one extractor: each
``extract`` then runs exactly one new layer. The probe writes a marker to stderr before each
layer, so the lines ncnn prints between two markers are that layer's; the layer whose extract
fails, returns an invalid Mat, or during which the probe dies is the one to blame. Its input
shapes and parameters give the likely cause (a pooling kernel larger than its input, a
convolution fed another channel count, shapes a BinaryOp cannot broadcast...).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..customops import register_ncnn_layers
from ..errors import BackendCrashed, NcnnRunError
from ..params import parse_ncnn_param
from .memory import available_bytes, show, too_large

_MARK = "@@wb-layer "
PROBE_SECONDS = 120.0


@dataclass
class LayerFailure:
    """The first layer of an ncnn model that failed on given inputs.

    ``inputs``: its bottom blobs' shapes as ncnn holds them ((c, h, w), (h, w), (w,)...);
    ``ret``: what ``extract`` returned (None when the probe died: ``signal`` says how);
    ``log``: the lines ncnn printed while running it; ``cause``: the likely reason."""

    layer: str
    type: str
    inputs: list[tuple[int, ...]]
    ret: int | None = None
    signal: str | None = None
    output: tuple[int, ...] | None = None
    log: list[str] = field(default_factory=list)
    cause: str = ""
    needs: int = 0  # bytes its output needs at the least (0: not estimated)

    def describe(self) -> str:
        """One paragraph: the layer, its inputs, what went wrong, ncnn's own words."""
        shown = ", ".join(str(list(s)) for s in self.inputs) or "no inputs"
        if self.signal:
            what = f"crashed the process ({self.signal})"
        elif self.ret not in (None, 0):
            what = f"failed (extract returned {self.ret})"
        else:
            what = f"produced an invalid blob of shape {list(self.output or ())}"
        text = f"layer {self.layer} ({self.type}) {what} on input shape(s) {shown}"
        if self.log:
            text += "; ncnn says: " + " | ".join(self.log[:3])
        else:
            text += "; ncnn printed nothing about it"
        return text


# -- the probe process ---------------------------------------------------------------------------
def _mat_shape(mat: Any) -> tuple[int, ...]:
    dims = mat.dims
    if dims == 1:
        return (mat.w,)
    if dims == 2:
        return (mat.h, mat.w)
    if dims == 3:
        return (mat.c, mat.h, mat.w)
    if dims == 4:
        return (mat.c, mat.d, mat.h, mat.w)
    return ()


def bad_mat(mat: Any) -> bool:
    """A Mat ncnn returned that holds no valid tensor: empty, or a size <= 0 (a layer whose
    output size came out negative, e.g. a kernel larger than its input)."""
    shape = _mat_shape(mat)
    return not shape or min(shape) <= 0


def _probe(spec_path: str) -> None:  # pragma: no cover - runs in the probe process
    """Run the model layer by layer; one JSON line per layer on stdout, a marker on stderr
    before each (ncnn's own lines then fall between two markers)."""
    import ncnn
    import numpy as np

    spec = json.loads(Path(spec_path).read_text())

    graph = parse_ncnn_param(spec["param"])
    net = ncnn.Net()
    fp16 = spec["precision"] == "fp16"
    net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = fp16
    net.opt.num_threads = 1
    register_ncnn_layers(net, Path(spec["param"]))
    if net.load_param(spec["param"]) != 0 or net.load_model(spec["bin"]) != 0:
        print(json.dumps({"unloadable": True}), flush=True)
        return
    feed = np.load(spec["feed"])
    ex = net.create_extractor()
    ex.set_light_mode(False)
    shapes: dict[str, list[int]] = {}
    for name in feed.files:
        arr = np.ascontiguousarray(feed[name])
        batch = spec["batch"].get(name)
        mat = ncnn.Mat(arr, batch_index=batch) if batch is not None else ncnn.Mat(arr)
        ex.input(name, mat.clone())
        shapes[name] = list(_mat_shape(mat))
    for i, layer in enumerate(graph.layers):
        if layer.type == "Input":
            continue
        os.write(2, f"\n{_MARK}{i}\n".encode())
        print(json.dumps({"i": i, "start": True,
                          "inputs": [shapes.get(b) for b in layer.bottoms]}), flush=True)
        for top in layer.tops:
            ret, mat = ex.extract(top)
            shape = list(_mat_shape(mat)) if ret == 0 else []
            if ret != 0 or not shape or min(shape) <= 0:
                print(json.dumps({"i": i, "failed": True, "ret": ret, "output": shape}),
                      flush=True)
                _leave()
            shapes[top] = shape
        print(json.dumps({"i": i, "done": True}), flush=True)
    print(json.dumps({"ok": True}), flush=True)
    _leave()


def _leave() -> None:  # pragma: no cover - the probe process
    """Exit at once: what ncnn prints while tearing down a failed net is no layer's."""
    os.write(2, f"\n{_MARK}-1\n".encode())
    sys.stdout.flush()
    os._exit(0)


# -- the parent side -------------------------------------------------------------------------------
def locate(param: Path, bin_path: Path, feed: dict[str, Any], precision: str = "fp32",
           batch_axes: dict[str, int | None] | None = None,
           seconds: float = PROBE_SECONDS) -> LayerFailure | None:
    """The first layer that fails on ``feed`` (the runner's checked feed), or None when every
    layer ran in the probe (or the probe could not load the model or did not finish)."""
    import numpy as np


    graph = parse_ncnn_param(param)
    with tempfile.TemporaryDirectory(prefix="wb-ncnn-probe-") as tmp:
        np.savez(Path(tmp) / "feed.npz", **{k: np.asarray(v) for k, v in feed.items()})
        spec = {"param": str(param), "bin": str(bin_path), "feed": str(Path(tmp) / "feed.npz"),
                "precision": precision, "batch": batch_axes or {}}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            proc = subprocess.run(
                [sys.executable, "-c", "from workbench.runtime.ncnn_failure import _probe; "
                 f"_probe({str(Path(tmp) / 'spec.json')!r})"],
                capture_output=True, text=True, errors="replace", timeout=seconds, env=env,
                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
    events = []
    for line in proc.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    logs = _logs_by_layer(proc.stderr)
    failed = next((e for e in events if e.get("failed")), None)
    if failed is None and proc.returncode < 0:  # died inside the last layer it started
        started = [e for e in events if e.get("start")]
        if not started:
            return None
        failed = {"i": started[-1]["i"], "ret": None, "output": None}
    if failed is None:
        return None
    start = next((e for e in events if e.get("start") and e["i"] == failed["i"]), {})
    layer = graph.layers[failed["i"]]
    sig = None
    if failed["ret"] is None:
        import signal as _signal

        try:
            sig = _signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
    inputs = [tuple(s) for s in start.get("inputs", []) if s is not None]
    out = tuple(failed["output"]) if failed.get("output") else None
    found = LayerFailure(layer.name, layer.type, inputs, failed["ret"], sig, out,
                         logs.get(failed["i"], []))
    found.cause = likely_cause(layer, inputs, out)
    found.needs = output_bytes_at_least(layer, inputs, 4 if precision == "fp32" else 2)
    return found


def output_bytes_at_least(layer: Any, inputs: list[tuple[int, ...]], elemsize: int) -> int:
    """A lower bound of the bytes ``layer``'s output takes on ``inputs`` (ncnn's shapes),
    for the layers whose output can outgrow their input: a convolution (num_output channels
    of at least the unpadded output size) and an Interp (its output size or scales); 0 for
    the others."""
    p, t, first = layer.params, layer.type, (inputs[0] if inputs else ())
    if t.startswith("Convolution") and first:
        spatial = {"1D": 1, "3D": 3}.get(t[-2:], 2)
        if len(first) < spatial + 1:
            return 0
        size = _int(p, 0, 0)  # num_output
        for axis, dim in enumerate(reversed(first[-spatial:])):  # w, h, d: keys 1-3, 11-13...
            kernel, dilation, stride = (_int(p, key + 10 * axis, _int(p, key, 1))
                                        for key in (1, 2, 3))
            span = dilation * (kernel - 1) + 1  # padding only adds to the output
            size *= max((dim - span) // max(stride, 1) + 1, 0)
        return size * elemsize
    if t == "Interp" and len(first) >= 2:
        h, w = first[-2], first[-1]
        oh = _int(p, 3, 0) or int(h * float(p.get(1, 1) or 1))
        ow = _int(p, 4, 0) or int(w * float(p.get(2, 1) or 1))
        return math.prod(first[:-2]) * oh * ow * elemsize
    return 0


def _logs_by_layer(stderr: str) -> dict[int, list[str]]:
    """ncnn's stderr lines, by the index of the layer running when each was printed."""
    out: dict[int, list[str]] = {}
    current = None
    for line in stderr.splitlines():
        if line.startswith(_MARK):
            current = int(line[len(_MARK):])
            current = None if current < 0 else current
            continue
        if current is not None and line.strip():
            out.setdefault(current, []).append(line.strip()[:200])
    return out


def _int(params: dict[int, Any], key: int, default: int) -> int:
    v = params.get(key)
    try:
        return int(float(v)) if isinstance(v, str) else default
    except ValueError:
        return default


def likely_cause(layer: Any, inputs: list[tuple[int, ...]],
                 output: tuple[int, ...] | None) -> str:
    """What about ``layer`` (its type, parameters) and its input shapes makes ncnn fail: the
    first of the causes its type can have that fits, or a size that came out empty."""
    for types, cause in _CAUSES:
        if layer.type.startswith(types):
            why = cause(layer.params, layer.type, inputs)
            if why:
                return why
    if output is not None and output and min(output) <= 0:
        return (f"its output size came out as {list(output)}: its parameters do not fit an "
                "input of this size (feed the size the model was converted at)")
    if layer.type == "MemoryData":
        return "a constant blob could not be made: the .bin does not hold what the .param says"
    return ""


def _product(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _pooling(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    first = inputs[0] if inputs else None
    if first is None or len(first) < 2 or _int(p, 4, 0):  # global pooling takes any size
        return ""
    kw = _int(p, 1, 0)
    kh = _int(p, 11, kw)
    h, w = first[-2], first[-1]
    pad = _int(p, 3, 0)
    if kw > w + 2 * pad or kh > h + 2 * pad:
        return (f"its kernel {kh}x{kw} is larger than its input {h}x{w}: the model was "
                "converted at a larger input size (a pooling sized for it), so feed that "
                "size, or make the pooling adaptive/global (nn.AdaptiveAvgPool2d(1))")
    return ""


def _convolution(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    first = inputs[0] if inputs else None
    num_out, k = _int(p, 0, 0), _int(p, 1, 0)
    kh, size = _int(p, 11, k), _int(p, 6, 0)
    group = _int(p, 7, 1) if "DepthWise" in t else 1
    if first is None or not (num_out and k and kh and size and len(first) >= 2):
        return ""
    per = size // max(num_out * k * kh, 1)
    want = per * group
    have = first[0]
    if want and have != want:
        return (f"it was built for {want} input channels (weights {size} = {num_out} "
                f"x {per} x {kh}x{k}), its input has {have}: an input or an earlier "
                "layer with another channel count (a .param edited, or weights of "
                "another model)")
    if t.startswith("Convolution") and len(first) >= 3 and (
            kh > first[-2] + 2 * _int(p, 4, 0) or k > first[-1] + 2 * _int(p, 4, 0)):
        return (f"its kernel {kh}x{k} is larger than its input {first[-2]}x"
                f"{first[-1]}: feed the size it was converted at")
    return ""


def _inner_product(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    first = inputs[0] if inputs else None
    num_out, size = _int(p, 0, 0), _int(p, 2, 0)
    if first is None or not (num_out and size):
        return ""
    want, have = size // num_out, first[-1]
    if have != want and _product(first) != want:
        return (f"it was built for {want} input features (weights {size} = {num_out} x "
                f"{want}), its input {list(first)} has {have}: the input or the layer "
                "before it changed size since conversion")
    return ""


def _binary_op(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    if t != "BinaryOp" or len(inputs) != 2 or _broadcasts(*inputs):
        return ""
    return (f"its two operands {list(inputs[0])} and {list(inputs[1])} do not broadcast "
            "against each other: a shape fixed at conversion (a constant, a reshape) "
            "meets an input of another size; feed the converted size")


def _concat(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    if t != "Concat" or len(inputs) < 2:
        return ""
    ranks = {len(s) for s in inputs}
    if len(ranks) > 1:
        return f"it joins blobs of different ranks {[list(s) for s in inputs]}"
    axis = _int(p, 0, 0)
    axis = axis + ranks.pop() if axis < 0 else axis
    others = [[d for a, d in enumerate(s) if a != axis] for s in inputs]
    if any(o != others[0] for o in others):
        return (f"it joins blobs {[list(s) for s in inputs]} on axis {axis}: their other "
                "axes differ")
    return ""


def _reshape(p: dict, t: str, inputs: list[tuple[int, ...]]) -> str:
    first = inputs[0] if inputs else None
    if t != "Reshape" or first is None:
        return ""
    want = [_int(p, k, -233) for k in (11, 2, 1, 0)]  # d, c, h, w as written
    fixed = [d for d in want if d not in (-233, 0, -1)]
    have, prod = _product(first), _product(tuple(fixed))
    if fixed and -1 not in want and prod != have:
        return (f"it reshapes {have} elements ({list(first)}) to {prod}: the sizes it holds "
                "come from the conversion's input; feed that size")
    return ""


# (layer type prefixes, the cause that type can have), tried in order
_CAUSES = ((("Pooling",), _pooling), (("Convolution", "Deconvolution"), _convolution),
           (("InnerProduct",), _inner_product), (("BinaryOp",), _binary_op),
           (("Concat",), _concat), (("Reshape",), _reshape))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """numpy's rule, right-aligned; ncnn accepts no more than that."""
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y and 1 not in (x, y):
            return False
    return True


def failure_hint(found: LayerFailure | None, model: str) -> str:
    """What to do about it: the likely cause when one is known, else where to look."""
    if found is None:
        return ("every layer ran on these inputs when run one by one, so the failure depends on "
                "how the run was made (threads, fp16, light mode): try precision='fp32' and "
                f"num_threads=1; `workbench inspect {model}` lists the layers")
    if found.cause:
        return f"{found.layer} ({found.type}): {found.cause}"
    return (f"look at {found.layer} ({found.type}) in {model} (its parameters against its input "
            f"shapes {[list(s) for s in found.inputs]}); compare with the torch module it "
            "came from, and feed the shape the model was converted at")


def explain(param: Path, bin_path: Path, feed: dict[str, Any], precision: str,
            batch_axes: dict[str, int | None], what: str) -> Exception:
    """An NcnnRunError for a failed ncnn run: ``what`` happened, then the layer to blame."""

    found = locate(param, bin_path, feed, precision, batch_axes)
    if found is None:
        return NcnnRunError(f"{what} ({param.name}); running it layer by layer found no "
                            "failing layer", failure_hint(None, param.name))

    avail = available_bytes()
    if found.needs and avail is not None and found.needs > avail:  # ncnn's -100: no memory
        return too_large(feed, param.name, found.needs, f"{what}: {found.describe()}",
                         asked=f"layer {found.layer} ({found.type}) failed; its output "
                         f"alone needs at least {show(found.needs)}")
    return NcnnRunError(f"{what} ({param.name}): {found.describe()}",
                        failure_hint(found, param.name))


# signals a model or an input makes ncnn raise (not a kill from outside: SIGKILL, SIGTERM)
_NATIVE = ("SIGSEGV", "SIGABRT", "SIGFPE", "SIGBUS", "SIGILL")


def explain_crash(param: Path, bin_path: Path, feed: dict[str, Any], precision: str,
                  batch_axes: dict[str, int | None], crashed: Any) -> Exception:
    """``crashed`` (a BackendCrashed from the worker) with the layer that crashes named, when
    ncnn itself crashed (SIGSEGV, SIGABRT...) and the probe finds the layer; else as it was."""

    if crashed.signal not in _NATIVE:
        return crashed
    found = locate(param, bin_path, feed, precision, batch_axes)
    if found is None:
        return crashed
    head, _, rest = crashed.message.partition("\n")
    return BackendCrashed(f"{head}\n{found.describe()}" + (f"\n{rest}" if rest else ""),
                          failure_hint(found, param.name), backend=crashed.backend,
                          signal_name=crashed.signal, log_tail=crashed.log_tail)
