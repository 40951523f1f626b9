"""ncnn's per-layer feature mask: a child ncnn artifact whose named layers run with some of
ncnn's features turned off (param key ``31=``), the rest of the net as it was.

ncnn reads ``31=<bits>`` on any layer into ``Layer::featmask`` (``src/net.cpp``,
``load_param``: ``layer->featmask = pd.get(31, 0)``) and runs and builds that layer with
``get_masked_option(opt, featmask)``, which can only clear options, never set them. The bits,
as ``get_masked_option`` defines them (ncnn ``src/net.cpp``; ``docs/developer-guide/
layer-feat-mask.md`` names them the same), are ``FEATMASK_BITS``. The usual fix for "right on
my PC, wrong on the phone" turns fp16 off for the whole net; this turns it off for the layer
that overflows and keeps the speed elsewhere.
"""

from __future__ import annotations

import difflib
import os
import platform
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact.record import Artifact
from ..artifact.workspace import Workspace, as_workspace
from ..diagnostics import Diagnostic
from ..errors import InputError, ModelFileError
from ..fileio import atomic_write_text
from ..onnx_io import check_model_file
from ..params import NcnnParam, parse_ncnn_param
from ..runtime.ncnn_model import check_model_files
from ..runtime.recorded import artifact_at, check_recorded

PARAM = ".ncnn.param"
KEY = 31  # ncnn's param id of the feature mask


@dataclass(frozen=True)
class FeatmaskBit:
    """One bit of ncnn's ``31=`` mask: its value, the ``Option`` fields it clears for the
    layer (``get_masked_option`` in ncnn's ``src/net.cpp``) and what that means."""

    name: str
    bit: int
    options: tuple[str, ...]
    meaning: str


# every bit ncnn's get_masked_option defines (ncnn src/net.cpp); the first four are the
# precision features ncnn_featmask takes as keywords
FEATMASK_BITS: tuple[FeatmaskBit, ...] = (
    FeatmaskBit("fp16_arithmetic", 1 << 0, ("use_fp16_arithmetic",), "no fp16 arithmetic"),
    FeatmaskBit("fp16_storage", 1 << 1, ("use_fp16_packed", "use_fp16_storage"),
                "no fp16 storage"),
    FeatmaskBit("bf16", 1 << 2, ("use_bf16_packed", "use_bf16_storage"), "no bf16 storage"),
    FeatmaskBit("int8", 1 << 3, ("use_int8_packed", "use_int8_storage", "use_int8_arithmetic"),
                "no int8 (ncnn's Vulkan layers read these options; see INT8_NOTE)"),
    FeatmaskBit("vulkan", 1 << 4, ("use_vulkan_compute", "use_tensor_storage"),
                "no Vulkan: the layer runs on the CPU"),
    FeatmaskBit("sgemm", 1 << 5, ("use_sgemm_convolution",), "no sgemm convolution"),
    FeatmaskBit("winograd", 1 << 6, ("use_winograd_convolution",),
                "no winograd convolution"),
    FeatmaskBit("threading", 1 << 7, ("num_threads",), "one thread (num_threads = 1)"),
)
BITS = {b.name: b for b in FEATMASK_BITS}
KEYWORDS = ("fp16_arithmetic", "fp16_storage", "bf16", "int8")

# ncnn's CPU layers choose int8 by opt.use_int8_inference and int8 weights in the .bin, which
# get_masked_option leaves alone; use_int8_packed/storage/arithmetic are read by its Vulkan
# layers (src/gpu.cpp, src/layer/vulkan/*). Measured here: the bit changes no CPU output.
INT8_NOTE = ("on the CPU (x86 and ARM) ncnn runs a layer in int8 when its weights are stored "
             "int8 (use_int8_inference, which the mask does not clear); the int8 bit clears "
             "use_int8_packed/storage/arithmetic, which only ncnn's Vulkan layers read")


def ncnn_featmask(
    nc: Artifact | str | os.PathLike[str],
    layers: Iterable[str] | str,
    *,
    fp16_arithmetic: bool | None = None,
    fp16_storage: bool | None = None,
    bf16: bool | None = None,
    int8: bool | None = None,
    workspace: Workspace | str | None = None,
) -> Artifact:
    """A child ncnn artifact with ncnn's per-layer feature mask (``31=``) set on ``layers``.

    The mask can only turn features off: a keyword set to False sets its bit on each named
    layer (OR-ed into a ``31=`` the layer already has), so ncnn runs that layer without the
    feature even when the net's options enable it; True or None leaves the layer as it was
    (a layer cannot be given a feature the net's options do not enable). The rest of the net
    runs as before, so fp16 stays on everywhere else. The mask changes a run only when the
    runner enables the feature: ``NcnnRunner(child, precision="bf16")`` with ``bf16=False``
    runs the named layers in fp32; a precision="fp32" run is the parent's, bit for bit.

    Args:
        nc: an ncnn Artifact (from ``wb.to_ncnn``, ``wb.quantize(..., backend="ncnn")`` or
            this stage), or a path to a ``.ncnn.param`` with its ``.ncnn.bin`` beside it.
        layers: ncnn layer names as the ``.ncnn.param`` writes them (its second column;
            ``NcnnRunner(nc).graph.layers``); a single name may be given as a str.
        fp16_arithmetic: False: no fp16 arithmetic in these layers (bit 0, value 1); the
            fix for a layer whose fp16 accumulation overflows on an ARMv8.2 phone.
        fp16_storage: False: no fp16 storage or packing (bit 1, value 2).
        bf16: False: no bf16 storage or packing (bit 2, value 4). A storage bit works from
            the input on: ncnn casts a 16-bit input blob to fp32 only for a layer that keeps
            the storage itself, so each input of a layer masked so must come from an Input
            layer or a layer masked the same way (else InputError, naming the layers to add).
        int8: False: ncnn's int8 bit (bit 3, value 8). It clears use_int8_packed, _storage
            and _arithmetic, which only ncnn's Vulkan layers read: a CPU run (x86 or ARM)
            still runs an int8-quantized layer in int8 (a warning says so). To keep a layer
            float on the CPU, quantize without it: ``wb.quantize(..., exclude=[layer])``.
        workspace: where the child goes; default the parent's workspace (or the default
            workspace for a path outside any). In another workspace than the parent's the
            child has no parent (its ``params["source_model"]`` names it).

    Returns:
        The child Artifact (stage "featmask", format "ncnn", parent ``nc``): the
        ``.ncnn.param`` with ``31=`` on exactly the named layers, and the parent's other
        files copied beside it (the ``.ncnn.bin``, pnnx's ``_ncnn.py``, a calibration
        table...) plus the ``.pnnx.param`` of its conversion, so ``NcnnRunner(child)`` and
        ``wb.compare(model, [child], x)`` take it exactly as the parent. ``params``:
        ``featmask`` {layer: the 31= value written}, ``features_off`` (the keywords set
        False), ``bits`` (the value OR-ed in), and the parent's ``precision`` and input
        shapes. The parent's files are never written.

    Raises:
        InputError: ``nc`` is not an ncnn model (another artifact format, a path of another
            kind); ``layers`` is empty, not names, or names a layer not in the model (the
            message names the model and the closest layer names); no keyword is False
            (nothing to turn off); a keyword is not True/False/None; a storage bit
            (fp16_storage, bf16) on a layer fed by a layer that keeps that storage.
        ModelFileError: a file of the model is missing, or changed since its stage wrote
            it, or its ``.bin`` does not fit its ``.param``; a ``31=`` in it is not an
            integer.
    """
    t0 = time.perf_counter()
    given = {"fp16_arithmetic": fp16_arithmetic, "fp16_storage": fp16_storage, "bf16": bf16,
             "int8": int8}
    off = _features_off(given)
    parent, param_path = _source(nc)
    names = _layer_names(layers)
    graph = _check_files(parent, param_path)
    targets = _find_layers(graph, names, _model_label(parent, param_path))
    bits = sum(BITS[f].bit for f in off)
    ws = parent.workspace if workspace is None and parent is not None and \
        parent.workspace is not None else as_workspace(workspace)
    same_ws = parent is not None and parent.workspace is not None and \
        Path(parent.workspace.path).resolve() == Path(ws.path).resolve()

    text, masks, unchanged = masked_param_text(param_path, graph, targets, bits)
    _check_storage_inputs(graph, masks, off, _model_label(parent, param_path))
    diags = _diagnostics(off, unchanged, bits)
    params: dict[str, Any] = {
        "featmask": masks, "features_off": off, "bits": bits,
        "source_model": parent.id if same_ws else str(param_path.absolute()),
        **{k: parent.params[k] for k in _INHERITED if parent is not None and k in parent.params},
    }
    with ws.staging() as d:
        for rel, src in _companions(parent, param_path).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, d / rel)
        atomic_write_text(d / param_path.name, text)
        parse_ncnn_param(d / param_path.name)  # the text written reads back as a graph
        return ws.commit(d, stage="featmask", format="ncnn", main=param_path.name,
                         parent=parent if same_ws else None, params=params,
                         seconds=time.perf_counter() - t0, diagnostics=diags)


# what the runner and the comparison read from an ncnn artifact's record: its precision (an
# int8 model), the input shapes of the conversion and the int8 blobs of the quantize stage
_INHERITED = ("precision", "fp16", "backend", "inputshape", "inputshape2", "int8_blobs")


def masked_param_text(param_path: Path, graph: NcnnParam, layers: list[str], bits: int
                      ) -> tuple[str, dict[str, int], list[str]]:
    """The ``.param`` text with ``bits`` OR-ed into ``31=`` of each of ``layers`` (added at
    the end of the line when the layer has none; the line otherwise as written).

    Returns:
        (the text, {layer: the 31= value now}, the layers whose 31= had every bit already).

    Raises:
        ModelFileError: a layer's existing ``31=`` is not an integer.
    """
    lines = param_path.read_text(encoding="utf-8").split("\n")
    by_name = {la.name: la for la in graph.layers}
    masks: dict[str, int] = {}
    unchanged = []
    for name in layers:
        la = by_name[name]
        old = _old_mask(la.params.get(KEY), param_path, la.line, name)
        masks[name] = old | bits
        if masks[name] == old:
            unchanged.append(name)
        lines[la.line - 1] = _set_key(lines[la.line - 1], 4 + len(la.bottoms) + len(la.tops),
                                      KEY, masks[name])
    return "\n".join(lines), masks, unchanged


# a token of a .param line: a run of non-space text or a quoted string (as params.py reads it)
_TOKEN = re.compile(r'(?:[^\s"]+|"[^"]*")+')


def _set_key(line: str, first_param: int, key: int, value: int) -> str:
    """``line`` with ``key=value``: the last ``key=`` token among the parameters (those from
    token ``first_param`` on) replaced in place, else appended; other text kept as written."""
    spans = [m.span() for m in _TOKEN.finditer(line)][first_param:]
    hits = [s for s in spans if line[s[0]:s[1]].startswith(f"{key}=")]
    if hits:
        a, b = hits[-1]  # ncnn's ParamDict keeps the last of a repeated id
        return f"{line[:a]}{key}={value}{line[b:]}"
    return f"{line.rstrip()} {key}={value}"


def _old_mask(value: Any, param_path: Path, lineno: int, name: str) -> int:
    if value is None:
        return 0
    try:
        return int(str(value))
    except ValueError:
        raise ModelFileError(
            f"{param_path.name} line {lineno}: layer {name!r} has 31={value}, expected an "
            "integer feature mask", "ncnn's 31= is an integer of OR-ed bits (1 fp16 "
            "arithmetic, 2 fp16 storage, 4 bf16, 8 int8...); fix or drop it") from None


def _features_off(given: dict[str, Any]) -> list[str]:
    for key, value in given.items():
        if value is not None and not isinstance(value, bool):
            raise InputError(f"{key}={value!r}: expected False (turn it off in these layers), "
                             "True or None (leave it)", f"e.g. {key}=False")
    off = [k for k in KEYWORDS if given[k] is False]
    if not off:
        raise InputError(
            "ncnn_featmask: no feature turned off (every keyword is True or None), nothing "
            "to do: the mask can only turn features off, never on",
            "set the feature to turn off in these layers to False, e.g. "
            "wb.ncnn_featmask(nc, ['conv_3'], fp16_arithmetic=False); keywords: "
            + ", ".join(KEYWORDS))
    return off


def _layer_names(layers: Any) -> list[str]:
    items = [layers] if isinstance(layers, str) else layers
    try:
        items = list(items)
    except TypeError:
        raise InputError(f"layers must be a list of ncnn layer names, got "
                         f"{type(layers).__name__}", "e.g. ['convrelu_3']") from None
    bad = [i for i in items if not isinstance(i, str) or not i]
    if bad:
        raise InputError(f"layers must be ncnn layer names (non-empty str), got {bad[0]!r}",
                         "names as the .ncnn.param's second column writes them, e.g. "
                         "['convrelu_3']")
    if not items:
        raise InputError("layers is empty: name the ncnn layers to mask",
                         "e.g. wb.ncnn_featmask(nc, ['convrelu_3'], fp16_arithmetic=False); "
                         "the names: [la.name for la in NcnnRunner(nc).graph.layers], or the "
                         "layers a comparison blames (rep.first_divergence)")
    return list(dict.fromkeys(items))


def _source(nc: Any) -> tuple[Artifact | None, Path]:
    """(the parent Artifact or None, its .ncnn.param) from an Artifact or a path; a path to
    the main file of an artifact in a workspace is that artifact (its lineage kept)."""
    if isinstance(nc, Artifact):
        if nc.format != "ncnn":
            raise InputError(f"ncnn_featmask takes an ncnn model; artifact {nc.id} is "
                             f"{nc.format}", "convert it first: wb.ncnn_featmask("
                             "wb.to_ncnn(...), layers, ...)")
        if not Path(nc.path).name.endswith(PARAM):
            raise InputError(f"ncnn_featmask takes an ncnn model; artifact {nc.id}'s main file "
                             f"{Path(nc.path).name} is not a {PARAM}",
                             "pass the artifact wb.to_ncnn or wb.quantize returned")
        return nc, Path(nc.path)
    if not isinstance(nc, (str, os.PathLike)):
        raise InputError(f"ncnn_featmask takes an ncnn Artifact or a path to a .ncnn.param, "
                         f"got {type(nc).__name__}", "e.g. wb.ncnn_featmask(wb.to_ncnn(model, "
                         "(x,)), layers, fp16_arithmetic=False)")
    path = Path(nc)
    if not path.is_file():
        check_model_file(path)  # missing, or a folder: ModelFileError
    if not path.name.endswith(PARAM):
        raise InputError(f"ncnn_featmask takes an ncnn model; {str(path)!r} is not a {PARAM}",
                         "pass the .ncnn.param (its .ncnn.bin beside it) or the artifact "
                         "wb.to_ncnn returned")
    return _artifact_at(path), path


def _artifact_at(path: Path) -> Artifact | None:
    """The artifact of a workspace whose main file ``path`` is, else None."""

    art = artifact_at(path)
    folder = path.absolute().parent.parent
    if art is None or art.path.name != path.name or not (folder / "manifest.json").is_file():
        return None
    try:
        return Workspace(folder).get(art.id)
    except InputError:
        return None


def _check_files(parent: Artifact | None, param: Path) -> NcnnParam:
    """The parent as its stage wrote it (sha256), its .bin beside and fitting the .param."""

    # changed on disk since its stage wrote it (an artifact's record, or the artifact.json
    # beside a path): ModelFileError naming the file, as NcnnRunner would refuse it
    check_recorded(parent if parent is not None else param, param)
    if not param.is_file():
        raise ModelFileError(f"ncnn model file {str(param)!r} does not exist",
                             "an ncnn model is a .ncnn.param and a .ncnn.bin side by side")
    weights = _bin_of(param)
    if not weights.is_file():
        raise ModelFileError(f"ncnn weights {str(weights)!r} do not exist (beside "
                             f"{param.name})", "an ncnn model is a .ncnn.param and a "
                             ".ncnn.bin side by side: keep the two files together")
    return check_model_files(param, weights)


def _bin_of(param: Path) -> Path:
    return param.with_name(param.name[: -len(".param")] + ".bin")


def _model_label(parent: Artifact | None, param: Path) -> str:
    return f"{param.name} (artifact {parent.id})" if parent is not None else str(param)


def _find_layers(graph: NcnnParam, names: list[str], model: str) -> list[str]:
    """``names`` checked against the layers of ``graph``; an unknown one is an InputError
    naming it, the model and the nearest names (a blob name: the layer that writes it)."""
    known = [la.name for la in graph.layers]
    missing = [n for n in names if n not in set(known)]
    if not missing:
        return names
    name = missing[0]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    writer = graph.producers.get(name)
    also = f" ({len(missing)} unknown in all: {', '.join(map(repr, missing[:6]))})" \
        if len(missing) > 1 else ""
    message = (f"layer {name!r} is not in {model}{also}; "
               + (f"closest: {', '.join(close)}" if close else
                  f"its {len(known)} layers: {', '.join(known[:8])}"
                  + (", ..." if len(known) > 8 else "")))
    hint = (f"{name!r} is a blob, written by layer {writer!r}: name that layer"
            if writer is not None else "use layer names as the .ncnn.param's second column "
            "writes them: [la.name for la in NcnnRunner(nc).graph.layers]")
    raise InputError(message, hint)


# the bits whose layer must be fed 32-bit blobs: ncnn's convert_layout (src/net.cpp) casts a
# 16-bit input to fp32 only when the layer's own options keep that storage
# (`opt.use_bf16_storage && !layer->support_bf16_storage`), so a layer masked from it reads
# the fp16/bf16 blob of an unmasked producer as fp32 (measured on x86 bf16: wrong values or a
# heap corruption, "pool allocator get wild")
STORAGE_BITS = ("fp16_storage", "bf16")


def _check_storage_inputs(graph: NcnnParam, masks: dict[str, int], off: list[str],
                          model: str) -> None:
    """Refuse a storage bit on a layer fed by a layer that keeps that storage: each input of
    a masked layer must come from an Input layer or a layer with the same bit."""
    by_name = {la.name: la for la in graph.layers}
    for feature in (f for f in STORAGE_BITS if f in off):
        bit = BITS[feature].bit

        def masked(name: str, bit: int = bit) -> bool:
            la = by_name[name]
            old = masks.get(name)
            if old is None:
                old = _old_mask(la.params.get(KEY), graph.path, la.line, name)
            return bool(old & bit)

        for name in masks:
            feeders = [graph.producers[b] for b in by_name[name].bottoms
                       if b in graph.producers]
            bad = [f for f in feeders if by_name[f].type != "Input" and not masked(f)]
            if not bad:
                continue
            chain = [a for a in _ancestors(graph, name)
                     if by_name[a].type != "Input" and not masked(a)]
            raise InputError(
                f"{feature}=False on layer {name!r} of {model}: its input comes from "
                f"{bad[0]!r} ({by_name[bad[0]].type}), which keeps {feature.replace('_', ' ')}; "
                f"ncnn casts a 16-bit input to fp32 only for a layer that keeps the storage "
                f"itself (convert_layout in ncnn's src/net.cpp), so {name!r} would read "
                f"{bad[0]!r}'s 16-bit blob as fp32: wrong values, or a crash",
                f"mask every layer from the input up to it: layers={[*chain, name]!r} (a "
                f"storage mask works from the input on); to fix an fp16 overflow, "
                f"fp16_arithmetic=False alone keeps fp16 storage and is safe on any layer")


def _ancestors(graph: NcnnParam, name: str) -> list[str]:
    """The layers ``name`` reads from, directly or not, in the order of the .param."""
    by_name = {la.name: la for la in graph.layers}
    seen: set[str] = set()
    todo = [name]
    while todo:
        for blob in by_name[todo.pop()].bottoms:
            writer = graph.producers.get(blob)
            if writer is not None and writer not in seen:
                seen.add(writer)
                todo.append(writer)
    return [la.name for la in graph.layers if la.name in seen]


def _companions(parent: Artifact | None, param: Path) -> dict[str, Path]:
    """The files the child carries over, by name in its folder: every file the parent's
    record lists but the .param (the .bin, pnnx's _ncnn.py, a calibration table...), else
    the .bin, _ncnn.py and .pnnx.param beside a path; and the .pnnx.param of the conversion
    (beside it, or its pnnx ancestor's) named as NcnnRunner looks for it beside the param."""
    stem = param.name[: -len(PARAM)]
    out: dict[str, Path] = {}
    if parent is not None:
        out.update({rel: parent.dir / rel for rel in parent.files if rel != param.name})
    else:
        for name in (_bin_of(param).name, f"{stem}_ncnn.py"):
            if (param.parent / name).is_file():
                out[name] = param.parent / name
    pnnx_name = f"{stem}.pnnx.param"
    if pnnx_name not in out:
        pnnx = _pnnx_param(parent, param.parent / pnnx_name)
        if pnnx is not None:
            out[pnnx_name] = pnnx
    return out


def _pnnx_param(parent: Artifact | None, beside: Path) -> Path | None:
    if beside.is_file():
        return beside
    if parent is None:
        return None
    try:
        lineage = parent.lineage()
    except InputError:  # an ancestor not in this workspace
        return None
    pnnx = next((a for a in reversed(lineage) if a.format == "pnnx"), None)
    return Path(pnnx.path) if pnnx is not None and Path(pnnx.path).is_file() else None


def _diagnostics(off: list[str], unchanged: list[str], bits: int) -> list[Diagnostic]:
    diags = []
    if unchanged:
        diags.append(Diagnostic(
            "warning", "featmask-unchanged",
            f"{len(unchanged)} layer(s) already had 31= with every bit of {bits}: "
            f"{', '.join(unchanged[:8])}; they run as in the parent",
            "nothing to do for them; mask other layers or other features"))
    if "int8" in off:
        diags.append(Diagnostic(
            "warning", "featmask-int8-cpu",
            f"int8=False sets ncnn's int8 bit (8), which a CPU run ignores: {INT8_NOTE}",
            "to run a layer in float on the CPU, quantize without it: wb.quantize(nc, "
            "calibration, backend='ncnn', exclude=[layer])"))
    if "fp16_arithmetic" in off and platform.machine().lower() in ("x86_64", "amd64", "i686",
                                                                    "i386"):
        diags.append(Diagnostic(
            "info", "featmask-fp16-arithmetic-not-here",
            "fp16_arithmetic=False changes nothing on this x86 CPU: ncnn computes fp32 here",
            "its effect shows on an ARM CPU with fp16 arithmetic (ARMv8.2 and later): run the "
            "child there, or under the ARM target of NcnnRunner, and compare"))
    return diags


__all__ = ["ncnn_featmask", "masked_param_text", "FEATMASK_BITS", "FeatmaskBit", "INT8_NOTE"]
