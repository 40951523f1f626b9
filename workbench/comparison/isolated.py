"""Isolated error: each op of a candidate run on reference inputs.

ONNX: one rewritten graph in which every aligned intermediate value is cut and fed from the
reference, so each op (or the small unaligned subgraph before it) runs on reference inputs,
all in one session run. ncnn: aligned bottoms fed with Extractor.input, in as few passes as
the graph allows. Runners know nothing of this (Polygraphy's split).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..shapes import reshaped
from .candidates import Candidate

if TYPE_CHECKING:
    from .align import Alignment


def fit_reference(ref: Any, like_shape: tuple[int, ...]) -> Any:
    """A reference array reshaped to a candidate tensor's shape, by the one rule
    (``shapes.same_elements``: a batch axis added or dropped, axes of size 1, leading axes
    merged).

    Raises:
        InputError: the shapes hold different elements (other input shapes).
    """
    import numpy as np

    out = reshaped(ref, like_shape)
    if out is None:
        raise InputError(f"reference shape {list(np.shape(ref))} cannot feed a candidate "
                         f"tensor of shape {list(like_shape)}",
                         "the candidate was converted with other input shapes; compare on the "
                         "shapes it was exported or converted with")
    return out


def reference_of(al: Alignment, name: str, ref_values: dict[str, Any],
                 shape: tuple[int, ...]) -> Any:
    """The reference value aligned with candidate tensor ``name``, in its layout
    (``al.layouts``), scale (``al.scales``) and shape (``fit_reference``)."""
    return fit_reference(al.as_candidate(name, ref_values[al.pairs[name]]), shape)


_ISOLATED: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()  # key -> (temp dir, runner)


def isolated(cand: Candidate, al: Alignment, ref_values: dict[str, Any],
              layout: dict[str, tuple], args: tuple) -> dict[str, Any] | None:
    """Each op of an ONNX candidate run on reference inputs, all in one session run. The
    rewritten model and its runner are kept (two at most) for the next comparison."""
    import numpy as np

    if cand.kind == "ncnn":
        return _isolated_ncnn(cand, al, ref_values, layout, cand.runner.feed(args))
    cut = sorted(v for v in al.pairs if v in layout)  # capture="all" holds every node output
    if not cut:  # nothing aligned: nothing to run (a graph needs an output)
        return {}
    st = cand.path.stat()
    key = (str(cand.path.resolve()), st.st_mtime_ns, st.st_size, tuple(cut))
    if key not in _ISOLATED:
        import tempfile

        import onnx

        from ..runtime.ort_runner import OrtRunner

        d = tempfile.TemporaryDirectory(prefix="wb-isolated-")
        path = Path(d.name) / "isolated.onnx"
        types = {v: layout[v][1] for v in cut}
        onnx.save(isolated_model(cand.path, cut, types), str(path))
        _ISOLATED[key] = (d, OrtRunner(path, isolated=cand.runner.isolated,
                                       libraries=getattr(cand.runner, "libraries", ()),
                                       timeout=cand.runner.timeout))
        while len(_ISOLATED) > 2:
            _ISOLATED.popitem(last=False)[1][0].cleanup()
    _ISOLATED.move_to_end(key)
    feeds = dict(cand.runner.feed(args))
    for name in cut:
        shape, dtype = layout[name]
        ref = reference_of(al, name, ref_values, shape).astype(dtype, copy=False)
        feeds[f"{name}__ref"] = np.ascontiguousarray(ref)
    return _ISOLATED[key][1].run(feeds)


def isolated_model(path: Path, cut: list[str], types: dict[str, Any]) -> Any:
    """The ONNX model with the values in ``cut`` cut: their consumers read a new graph input
    ``<value>__ref`` (fed from the reference); chains of values not cut (the nodes a module
    was lowered into) stay connected, so they run from the nearest reference inputs. Its
    outputs are the cut values, as their nodes compute them: only what is measured."""
    from onnx import helper

    from ..onnx_io import load_onnx

    model = load_onnx(path)
    graph = model.graph
    cut_set = set(cut)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in cut_set:
                node.input[k] = f"{name}__ref"
    for name in cut:  # no shape: the same model serves every input size
        graph.input.append(helper.make_tensor_value_info(
            f"{name}__ref", helper.np_dtype_to_tensor_dtype(types[name]), None))
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(types[name]), None) for name in cut)
    return model


def _isolated_ncnn(cand: Candidate, al: Alignment, ref_values: dict[str, Any],
                   layout: dict[str, tuple], model_inputs: dict[str, Any]) -> dict[str, Any]:
    """Each ncnn layer on reference inputs: aligned bottoms are fed from the reference with
    Extractor.input, in as few passes as the graph allows (a layer cannot be measured in the
    pass that feeds its own output to another layer; greedy colouring, 2-3 passes)."""
    from ..params import parse_ncnn_param

    layers = [ly for ly in parse_ncnn_param(cand.path).layers
              if ly.type not in ("Input", "MemoryData")]
    alias = {top: ly.bottoms[0] for ly in layers if ly.type == "Split" for top in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    producer = {top: ly for ly in layers for top in ly.tops}

    def frontier(blob: str, seen: set[str]) -> set[str]:
        """The aligned blobs ``blob`` is computed from: itself when aligned, else those of
        the layer that makes it (an unaligned step between, e.g. an int8 model's GELU that
        no longer matches torch's, runs on them), none from the model's inputs."""
        blob = root(blob)
        if blob in al.pairs:
            return {blob}
        ly = producer.get(blob)
        if ly is None or blob in seen:
            return set()
        seen.add(blob)
        return set().union(*(frontier(b, seen) for b in ly.bottoms))

    fed_of = {}  # layer name -> blobs to feed
    for ly in layers:
        if ly.type == "Split":
            continue
        # fed as the blob a Split copies, which the Split then hands on: that blob is the one
        # a capture saw (and knows the batch of); a Split top fed alone lost its batch. An
        # unaligned bottom is fed through the aligned blobs it comes from: left unfed, the
        # layer ran on the candidate's own upstream values, its "isolated" error the
        # accumulated one
        fed = set().union(*(frontier(b, set()) for b in ly.bottoms)) if ly.bottoms else set()
        fed_of[ly.name] = {b: b for b in fed}
    passes: list[tuple[set, dict, list]] = []  # (measured tops, feeds blob->source, layers)
    for ly in layers:
        if ly.type == "Split" or not any(t in al.pairs for t in ly.tops):
            continue
        feeds = fed_of[ly.name]
        for tops, fed, members in passes:
            clash = (set(ly.tops) & {root(b) for b in fed} or set(ly.tops) & set(fed.values())
                     or {src for src in feeds.values()} & tops)
            if not clash:
                tops.update(ly.tops)
                fed.update(feeds)
                members.append(ly)
                break
        else:
            passes.append((set(ly.tops), dict(feeds), [ly]))
    out: dict[str, Any] = {}
    for tops, fed, _members in passes:
        blobs = dict(model_inputs)  # the model's own inputs, as they are
        blobs.update({b: reference_of(al, src, ref_values, layout[src][0])
                      for b, src in fed.items() if src in layout})
        wanted = [t for t in tops if t in al.pairs]
        out.update(cand.runner.run_blobs(blobs, wanted))
    return {n: _as_captured(cand, n, v, layout) for n, v in out.items()}


def _as_captured(cand: Candidate, name: str, value: Any, layout: dict[str, tuple]) -> Any:
    """A blob of an isolated ncnn run in the layout its capture="all" run gave: run_blobs
    returns a batched model output with its batch first, as ncnn holds it, where the
    runner's outputs put the batch at the torch axis pnnx recorded (``out_specs``)."""
    import numpy as np

    want = layout.get(name, (None,))[0]
    if want is None or tuple(np.shape(value)) == tuple(want):
        return value
    spec = getattr(cand.runner, "out_specs", {}).get(name)
    axis = getattr(spec, "batch_axis", None)
    if axis is not None and 0 <= axis < np.ndim(value):
        moved = np.moveaxis(value, 0, axis)
        fitted = reshaped(moved, want)
        if fitted is not None:
            return fitted
    return value
