"""Storage emulation for ncnn: fp16 (as an ARM phone stores it) or bf16 between layers, on x86.

On this machine ncnn runs few layers in fp16 even when asked, so a native fp16 run often
returns the fp32 outputs bit for bit; ARM phones, ncnn's target, keep blobs and weights in
fp16 between layers. ``NcnnRunner(source, precision="fp16", emulate="arm-fp16")`` measures
what that storage costs here:

- every weight rounded once, at load: the ``.bin`` is walked (``workbench.ncnn_bin``) and
  each float weight blob rounded in a copy that ncnn loads and that is deleted as soon as it
  has read it (ncnn copies weights into its own memory at ``load_model``). A file, not a
  hook: ncnn's Python API exposes no layer's weights, and ``load_model_mem`` reports no
  error;
- every blob rounded between layers: the graph runs layer by layer from one extractor, in
  the ``.param``'s order; each layer's tops are extracted (its bottoms are set, so exactly
  that layer runs), rounded, and handed back with ``Extractor.input`` for the layers that
  read them. The model inputs are rounded too (ARM casts them at the first layer).

Storage only. The layers themselves run ncnn's x86 fp32 kernels, so this does **not**
emulate fp16 accumulation or arithmetic inside a layer (ARM's ``use_fp16_arithmetic``), ARM's
kernels and their summation order, winograd / im2col / packing (elempack 8) variants, the
layers ARM leaves in fp32 (every blob is rounded here: an upper bound on storage rounding),
Vulkan, or int8 (refused). ``arm-fp16`` rounds as ARM's FCVT does (to nearest even,
subnormals kept, overflow to inf); ``bf16`` rounds to nearest even too, as bf16 hardware
does (ARM's BFCVT, x86's AVX512-BF16).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..diagnostics import Diagnostic
from ..errors import InputError
from ..ncnn_bin import FP32_TAG, walk_bin
from .base import BlobCapture
from .ncnn_failure import bad_mat
from .ncnn_io import INT_DTYPES

# emulate name -> the precision it goes with
EMULATIONS = {"arm-fp16": "fp16", "bf16": "bf16"}
NOT_EMULATED = ("fp16 accumulation and arithmetic inside a layer (ARM's use_fp16_arithmetic), "
                "ARM's kernels and their summation order, winograd/im2col/packing variants, "
                "the layers ARM keeps in fp32 (every blob is rounded here: an upper bound), "
                "Vulkan, int8")
# layers that only move values: an integer input stays integer through them (not rounded)
_MOVES = frozenset(("Split", "Reshape", "Flatten", "Crop", "Slice", "Squeeze", "ExpandDims",
                    "Permute", "Concat", "Tile", "Flip", "Noop", "Dropout"))
# int8 in the .param: the layer's weights are (or become at load) int8
_INT8_KEYS = {"Convolution": 8, "ConvolutionDepthWise": 8, "InnerProduct": 8, "LSTM": 8,
              "GRU": 8, "RNN": 8, "Embed": 18, "Gemm": 18, "MultiHeadAttention": 18}


def round_fp16(a: Any) -> Any:
    """float32 values as fp16 holds them: IEEE round to nearest even (ARM's FCVT), subnormals
    kept, beyond 65504 to inf; float32 again."""
    import numpy as np

    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def round_bf16(a: Any) -> Any:
    """float32 values as bf16 holds them: round to nearest even, as bf16 hardware converts
    (ARM's BFCVT, x86's VCVTNEPS2BF16; ncnn's fallback without it cuts the low 16 bits off,
    and its own bf16 run here came out closer to rounding); NaN stays NaN; float32 again.
    numpy has no bfloat16: the rounding is done on the bits."""
    import numpy as np

    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    up = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    nan = np.isnan(bits.view(np.float32))
    out = np.where(nan, bits | np.uint32(0x00400000), bits + np.where(nan, 0, up).astype(
        np.uint32)) & np.uint32(0xFFFF0000)
    return out.astype(np.uint32).view(np.float32)


_ROUND = {"arm-fp16": round_fp16, "bf16": round_bf16}


@dataclass
class Emulation:
    """An emulated storage precision for one ncnn model.

    ``name``: "arm-fp16" or "bf16"; ``weights``: weight blobs rounded at load; ``unrounded``:
    the layer (type) from which the .bin could not be walked (a layer type
    ``workbench.ncnn_bin`` cannot size): its weights and those after it are loaded as they
    are."""

    name: str
    weights: int = 0
    unrounded: str | None = None

    def round(self, a: Any) -> Any:
        return _ROUND[self.name](a)

    @property
    def diagnostic(self) -> Diagnostic:
        """What this run emulates, and what it does not (level info; warning when some
        weights could not be rounded)."""
        kind = "fp16 as ARM stores it" if self.name == "arm-fp16" else "bf16"
        message = (f"ncnn storage emulated ({self.name}): every weight and every blob between "
                   f"layers rounded to {kind}, the layers run in fp32 on this CPU. Not "
                   f"emulated: {NOT_EMULATED}")
        hint = ("this is what storage costs; measure arithmetic on the target (an ARM CPU with "
                "fp16, ncnn.cpu_support_arm_asimdhp(), or a Vulkan GPU)")
        if self.unrounded:
            message += (f". Weights from layer {self.unrounded} on were not rounded: "
                        "workbench.ncnn_bin cannot size that layer type")
            return Diagnostic("warning", "ncnn-storage-emulated-partly", message,
                              "report the layer type so its layout is added to ncnn_bin.py; "
                              + hint)
        return Diagnostic("info", "ncnn-storage-emulated", message, hint)


def check_emulate(emulate: str | None, precision: str, graph: Any, bin_path: Path
                  ) -> Emulation | None:
    """The Emulation NcnnRunner(..., emulate=) asks for, or an InputError naming what does
    not fit: an unknown name, a precision it does not go with, an int8 model."""
    if emulate is None:
        return None
    if emulate not in EMULATIONS:
        raise InputError(f"emulate={emulate!r} is not one of {tuple(EMULATIONS)}",
                         "emulate='arm-fp16' (with precision='fp16') rounds storage as an ARM "
                         "phone does; emulate='bf16' (with precision='bf16') as ncnn's bf16 "
                         "storage does; None runs ncnn as it is")
    want = EMULATIONS[emulate]
    if precision != want:
        raise InputError(
            f"emulate={emulate!r} emulates {want} storage, but precision={precision!r}",
            f"NcnnRunner(model, precision={want!r}, emulate={emulate!r})"
            + ("; precision='fp32' keeps fp32 storage: nothing to emulate"
               if precision == "fp32" else ""))
    int8 = [la for la in graph.layers if la.type in _INT8_KEYS
            and str(la.params.get(_INT8_KEYS[la.type], "0")) not in ("0", "")]
    if not int8:

        held = {b.layer for b in walk_bin(graph, bin_path).blobs
                if b.storage in ("int8", "quantized")}
        int8 = [la for la in graph.layers if la.name in held]
    if int8:
        shown = ", ".join(f"{la.name} ({la.type})" for la in int8[:3])
        raise InputError(
            f"emulate={emulate!r}: {bin_path.name} holds int8 weights ({shown}"
            + (f" and {len(int8) - 3} more" if len(int8) > 3 else "") + ")",
            "storage emulation rounds float weights and blobs; it does not emulate int8. "
            "Emulate the float model (the parent of the int8 artifact), and run the int8 "
            "model as it is: NcnnRunner(int8_model)")
    return Emulation(emulate)


def rounded_bin(graph: Any, bin_path: Path, emulation: Emulation) -> bytes:
    """The ``.bin`` with every float weight rounded as ``emulation`` stores it (fp16 blobs
    stay fp16 for arm-fp16; for bf16 they are written as fp32 holding bf16 values). Sets
    ``emulation.weights`` and, when the walk stops at a layer it cannot size,
    ``emulation.unrounded``: the bytes from there on are copied as they are."""
    import numpy as np


    layout = walk_bin(graph, bin_path)
    data = bin_path.read_bytes()
    out = bytearray()
    start = 0
    emulation.weights = 0
    for blob in layout.blobs:
        flag = data[start:blob.offset]  # 4 bytes for a tagged blob, none for a raw one
        if blob.storage in ("float32", "float32-scaled"):
            values = np.frombuffer(data, "<f4", blob.count, blob.offset)
            out += flag + emulation.round(values).astype("<f4").tobytes()
        elif blob.storage == "float16" and emulation.name == "bf16":
            values = np.frombuffer(data, "<f2", blob.count, blob.offset).astype(np.float32)
            out += FP32_TAG.to_bytes(4, "little") + emulation.round(values).astype(
                "<f4").tobytes()
        else:  # fp16 already (arm-fp16); int8 models are refused by check_emulate
            out += data[start:start + blob.nbytes]
        emulation.weights += 1
        start += blob.nbytes
    if layout.unknown:
        at = next((la for la in graph.layers if la.type == layout.unknown[0]), None)
        emulation.unrounded = f"{at.name} ({at.type})" if at else layout.unknown[0]
    out += data[start:]
    return bytes(out)


def load_rounded(net: Any, graph: Any, bin_path: Path, emulation: Emulation) -> int:
    """ncnn's ``load_model`` of the rounded weights: written to a temporary file that is
    deleted once ncnn has read it. Returns ncnn's status (0: loaded)."""
    fd, tmp = tempfile.mkstemp(prefix="wb-emulated-", suffix=".ncnn.bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(rounded_bin(graph, bin_path, emulation))
        return net.load_model(tmp)
    finally:
        os.unlink(tmp)


def _integer_blobs(runner: Any) -> set[str]:
    """Blobs that hold integers (an index input, and what only moves it): never rounded."""

    ints = {n for n, s in runner.in_specs.items() if s.dtype in INT_DTYPES}
    for la in runner._graph.layers:
        if la.type in _MOVES and la.bottoms and all(b in ints for b in la.bottoms):
            ints.update(la.tops)
    return ints


def _needed(graph: Any, wanted: list[str], fed: set[str]) -> list[Any]:
    """The layers, in the .param's order, that make ``wanted`` from the ``fed`` blobs."""
    todo, need = list(wanted), set()
    while todo:
        blob = todo.pop()
        if blob in fed:
            continue
        producer = graph.producers.get(blob)
        if producer is None or graph.layer(producer).type == "Input":
            raise InputError(f"blob {blob!r} of {graph.path.name} is a model input and was not "
                             "fed", "feed every model input the wanted blobs depend on")
        if producer not in need:
            need.add(producer)
            todo += graph.layer(producer).bottoms
    return [la for la in graph.layers if la.name in need]


def execute(runner: Any, feed: dict[str, Any], capture: Any) -> dict[str, Any]:
    """NcnnRunner's run with storage rounded between layers (see the module docstring).

    ``capture``: "outputs", "all" (every blob, as stored: rounded) or a BlobCapture for
    ``run_blobs`` (the fed blobs are rounded as stored, then the layers up to ``names``
    run). Returns what NcnnRunner's own ``_execute`` returns for it."""
    import ncnn
    import numpy as np

    emulation = runner.emulation
    graph = runner._graph
    ints = _integer_blobs(runner)
    ex = runner.net.create_extractor()
    ex.set_light_mode(False)  # every blob is kept (no layer runs in place on a fed one)
    mats: dict[str, Any] = {}  # the rounded Mats handed to ncnn: alive as long as `ex`
    arrays: dict[str, Any] = {}
    for name, arr in feed.items():
        held = np.ascontiguousarray(arr if name in ints else emulation.round(arr))
        # a model input with its batch axis, as NcnnRunner feeds it; captured as ncnn holds it
        mats[name] = runner._mat(name, held).clone()
        arrays[name] = np.asarray(mats[name])
        ex.input(name, mats[name])
    if isinstance(capture, BlobCapture):
        wanted = list(capture.names)
        layers = _needed(graph, wanted, set(feed))
    else:
        outputs = runner._model_outputs()
        wanted = list(outputs)
        if capture == "all":
            wanted += [b.name for b in runner.net.blobs() if b.name not in set(outputs)]
        layers = [la for la in graph.layers if la.type != "Input"]
    for layer in layers:
        for top in layer.tops:
            ret, mat = ex.extract(top)
            if ret != 0 or bad_mat(mat):
                raise runner._explained(feed, f"ncnn extract({top!r}) returned {ret}"
                                        + (" an invalid blob" if ret == 0 else ""))
            value = np.asarray(mat)
            held = np.array(value) if top in ints else emulation.round(value)
            arrays[top] = held = np.ascontiguousarray(held)
            mats[top] = ncnn.Mat(held)
            ex.input(top, mats[top])  # the layers reading it get the rounded blob
    if isinstance(capture, BlobCapture):
        return {name: np.array(arrays[name]) for name in wanted}
    result = {}
    for name in wanted:
        if name not in arrays:
            continue
        spec = runner.out_specs.get(name)
        if spec is not None and spec.batch_axis is not None:
            result[name] = np.array(mats[name].numpy(batch_index=spec.batch_axis))
        else:
            result[name] = arrays[name]
    return result
