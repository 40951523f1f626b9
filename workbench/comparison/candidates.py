"""The candidates of a comparison: each one's runner and display name, the tensors it
produces (tensors.py: with the module hints alignment starts from), and each backend's own
inputs; a quantized candidate paired as its float parent pairs (``parent_pairing``)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    BackendCrashed,
    BackendTimeout,
    InputError,
    RemoteError,
    RunError,
    WorkbenchError,
)
from .align import Alignment
from .tensors import candidate_tensors, with_weights

# a candidate's run that fails so: that candidate is not ok (report.failed says why) and
# the others are still compared
RUN_FAILURES = (BackendCrashed, BackendTimeout, RunError, RemoteError)


@dataclass
class Candidate:
    """A candidate backend: its runner, a display name, and how to list its tensors."""

    name: str
    runner: Any
    kind: str  # "onnx" | "ncnn"
    path: Path
    own: bool = False  # a runner compare built (and keeps), not one it was given
    precision: str = "fp32"  # what it was asked to run in: fp32, fp16, bf16, int8


def as_candidate(thing: Any, index: int) -> Candidate:
    """``thing`` (an ONNX or ncnn artifact, a path or a runner; the ``index``-th candidate)
    as a Candidate; runners built here are kept while their file is unchanged."""
    from ..runtime import NcnnRunner, OrtRunner, Runner, runner_for

    runner = thing if isinstance(thing, Runner) else None
    if runner is None:
        try:
            # one intra-op thread: the captures run in the worker on one core while torch
            # and the measuring take the other (schedule.py)
            runner = _cached_runner(thing, lambda t: runner_for(t, num_threads=1))
        except InputError as e:
            raise InputError(f"candidate {index} ({type(thing).__name__}): {e.message}",
                             e.hint) from None
    own = runner is not thing
    if isinstance(runner, OrtRunner):
        int8 = " int8" if _stored_precision(thing) == "int8" else ""
        return Candidate(f"onnxruntime{int8} {_label(thing, runner.path)}", runner, "onnx",
                         runner.path, own, int8.strip() or "fp32")
    if isinstance(runner, NcnnRunner):
        # an int8 model, whether given as its artifact or as a runner of it
        int8 = "int8" in (_stored_precision(thing), _stored_precision(runner.source))
        precision = "int8" if int8 else runner.precision
        label = precision
        if getattr(runner, "emulate", None):  # storage rounded between layers, not native
            label = f"{precision} emulated {runner.emulate}"
        if getattr(runner, "target", None):  # ncnn's ARM build: what ran, on which target
            flags = runner.flags
            label = f"{'int8' if precision == 'int8' else flags.label} {runner.target}"
        return Candidate(f"ncnn {label} {_label(thing, runner.param)}", runner,
                         "ncnn", runner.param, own, precision)
    raise InputError(f"candidate {index} is a {type(runner).__name__}; compare takes ONNX or "
                     "ncnn artifacts, paths or their runners", "e.g. wb.compare(model, [onx, nc], "
                     "(x,))")


def precision_not_exercised(cand: Candidate, args: tuple, values: dict[str, Any]) -> str | None:
    """Why an ncnn candidate asked for fp16 or bf16 (natively, not emulated) shows fp32's
    figures: its outputs (``values``, captured on ``args``) are bit-identical to the same
    model run in fp32 (ncnn on x86 runs few layers in fp16 even when asked; ARM phones
    compute in fp16). None when they differ, or for any other candidate."""
    import platform

    import numpy as np

    from ..runtime import NcnnRunner

    runner = cand.runner
    if cand.kind != "ncnn" or cand.precision not in ("fp16", "fp16-storage", "bf16") or \
            getattr(runner, "emulate", None):
        return None
    try:
        fp32 = NcnnRunner(runner.param, precision="fp32", num_threads=1).run(args)
    except WorkbenchError:  # the fp32 run fails: nothing to tell it by
        return None
    if not fp32 or any(name not in values or not np.array_equal(
            np.asarray(values[name]), out, equal_nan=True) for name, out in fp32.items()):
        return None
    if getattr(runner, "target", None):  # ncnn's ARM build, which has the fp16 kernels
        return (f"{cand.precision} not exercised on {runner.target}: its outputs are "
                f"bit-identical to this machine's fp32 run of the same files, so every layer "
                f"on their path computed in fp32 there (a 31= feature mask, or no "
                f"{cand.precision} kernel for the layer)")
    return (f"{cand.precision} not exercised: on this CPU ({platform.machine()}) ncnn ran "
            f"the model in fp32 (its outputs are bit-identical to an fp32 run of the same "
            f"files), so these figures hold no {cand.precision} storage or arithmetic, only "
            f"the weights as the file stores them; measure on the target, or see what "
            f"{cand.precision} storage costs: NcnnRunner(artifact, precision="
            f"{cand.precision!r}, emulate="
            f"{'arm-fp16' if cand.precision == 'fp16' else 'bf16'!r})")


_RUNNERS: OrderedDict[tuple, Any] = OrderedDict()
_RUNNER_CACHE_SIZE = 4


def _runner_key(thing: Any) -> tuple | None:
    """What a cached runner of an artifact or path is kept under (None: not a file)."""
    path = getattr(thing, "path", thing)
    try:
        st = Path(path).stat()
    except (OSError, TypeError):
        return None
    return (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def check_files_ahead(things: list[Any]) -> None:
    """The recorded files of the candidates compare is about to build runners for, hashed
    at once, a thread each: hashlib lets go of the GIL, and Artifact.check_files keeps what
    it verified, so each runner's own check then finds its files done (a 4-layer decoder's
    ONNX and ncnn files, 1.33 GB each, took 5-7 s one after the other). What is wrong with
    a file is left to the runner's own check to say."""
    from concurrent.futures import ThreadPoolExecutor

    from ..runtime import Runner
    from ..runtime.recorded import artifact_at

    arts = []
    for thing in things:
        key = _runner_key(thing)
        if isinstance(thing, Runner) or key is None or key in _RUNNERS:
            continue  # a runner, not a file, or one already built (checked then)
        art = thing if hasattr(thing, "check_files") else artifact_at(Path(key[0]))
        if art is not None:
            arts.append(art)
    if len(arts) > 1:
        with ThreadPoolExecutor(len(arts), thread_name_prefix="wb-compare-hash") as pool:
            list(pool.map(_check_quietly, arts))


def _check_quietly(art: Any) -> None:
    try:
        art.check_files()
    except WorkbenchError:
        pass  # raised again, with its hint, by the runner that loads the file


def _cached_runner(thing: Any, make: Any) -> Any:
    """The runner for an artifact or path, kept across calls (a few, least recently used
    dropped) while its file is unchanged: re-running a comparison in a notebook then reuses
    the sessions and nets the worker already built."""
    key = _runner_key(thing)
    if key is None:
        return make(thing)  # not a file: runner_for says what it is
    if key in _RUNNERS:
        _RUNNERS.move_to_end(key)
        return _RUNNERS[key]
    runner = _RUNNERS[key] = make(thing)
    while len(_RUNNERS) > _RUNNER_CACHE_SIZE:
        _RUNNERS.popitem(last=False)  # its worker twin goes with it
    return runner


def _stored_precision(thing: Any) -> str | None:
    """The precision the quantize stage recorded on an artifact (None for others)."""
    params = getattr(thing, "params", None)
    return params.get("precision") if isinstance(params, dict) else None


def _label(thing: Any, path: Path) -> str:
    """The artifact id; for a runner or path, the artifact folder or the file name."""
    label = getattr(thing, "id", None)
    if label:
        return label
    return path.parent.name if (path.parent / "artifact.json").exists() else path.name


def input_sets(inputs: Any) -> list[tuple]:
    """``inputs`` (a tuple, or a list of tuples) as a list of tuples of tensors."""
    from ..inputs import as_tensor_tuple

    if isinstance(inputs, list) and inputs and all(isinstance(i, (tuple, list)) for i in inputs):
        return [as_tensor_tuple(i, f"inputs[{k}]") for k, i in enumerate(inputs)]
    return [as_tensor_tuple(inputs)]


def copies(args: tuple) -> tuple:
    """A copy of each input tensor, for one backend's run."""
    return tuple(a.clone() for a in args)


def alignment_of(reference: Any, thing: Any, inputs: tuple) -> Any:
    """How ``thing`` (an ONNX/ncnn artifact, path or runner) aligns with ``reference`` (an
    ``nn.Module``) on ``inputs``: compare's capture and align steps alone, nothing measured
    (sensitivity aligns a quantized candidate's float parent with it).

    Returns:
        The Alignment compare would make on these inputs.

    Raises:
        InputError: a candidate compare does not take, or inputs it does not.
    """
    from ..runtime import runner_for
    from .align import align

    cand = as_candidate(thing, 0)
    modules = {n for n, _ in reference.named_modules()}
    ref_values = runner_for(reference).run(copies(inputs), capture="all")
    values = cand.runner.run(copies(inputs), "all")
    tensors = with_weights(candidate_tensors(cand, modules), cand, reference)
    return align(ref_values, values, tensors, modules)


def float_parent(path: Any) -> Any:
    """The float Artifact a quantize artifact's main file ``path`` was made from (None for
    another file, or when the parent's files are gone)."""
    import json

    from ..artifact import Artifact

    folder = Path(path).parent
    try:
        rec = json.loads((folder / "artifact.json").read_text())
        if rec.get("stage") != "quantize" or not rec.get("parent"):
            return None
        pfolder = folder.parent / rec["parent"]
        prec = json.loads((pfolder / "artifact.json").read_text())
    except (OSError, ValueError):
        return None
    parent = Artifact.from_record(prec, pfolder)
    return parent if parent.path.exists() else None


def parent_pairing(reference: Any, cand: Candidate, al: Alignment, inputs: tuple,
                   floats: Any = None
                   ) -> tuple[Alignment, dict[str, str], dict[str, tuple[str, ...]]]:
    """A quantized candidate's alignment ``al`` with its tensors paired as its float parent
    pairs them (the rule: a quantized candidate's tensor takes its float parent's pair).

    The quantized graph is its parent's modulo QuantizeLinear/DequantizeLinear (ONNX Runtime:
    ``x`` becomes ``x_DequantizeLinear_Output``) or with the same blob names (ncnn), but its
    values are off by the int8 error, and where a folding leaves two reference tensors close
    in order (a conv and the BatchNorm folded into it) its own values can no longer tell them
    apart: the quantized conv pairs with the conv, and feeding its readers the conv's value
    (or putting its output in place of the conv's) applies the BatchNorm never (or twice).
    The parent's values are exact: its pairs decide. A tensor takes the parent's pair of the
    tensor it stands for: its own name, or the tensor its Q/DQ copy copies
    (``x_DequantizeLinear_Output`` -> ``x``), with the parent's relation, layout and scale.
    A tensor the candidate left unpaired (too far from every torch tensor, or attributed)
    takes the parent's pair too, so that its readers' isolated runs read the reference and
    not its own accumulated value; not ``x`` itself when a Q/DQ copy of it is there (only its
    QuantizeLinear reads it: fed from the reference, the copy would hold the reference
    rounded, not the layer's error), nor a tensor that is not in ``floats`` (the candidate's
    float tensors; None: any).

    Returns:
        (the alignment re-paired, {candidate tensor: reference} for the pairs that changed
        or were added, the parent's ``covers`` of every tensor it pairs as the parent does:
        the pairs it had and the pairs it takes). ``al`` as
        it is, and nothing changed, for a candidate that is not a quantize artifact or whose
        parent does not align.
    """
    parent = float_parent(cand.path)
    if parent is None:
        return al, {}, {}
    from ..precision.qdq import float_name

    try:  # the parent's alignment alone (compare() here would be an import cycle)
        pal = alignment_of(reference, parent, inputs)
    except InputError:
        return al, {}, {}
    names = [*al.pairs, *al.unaligned, *al.attributed]
    copied = {f for n in names if (f := float_name(n)) != n}  # x, when x's Q/DQ copy is here
    out = dataclasses.replace(al, pairs=dict(al.pairs), relations=dict(al.relations),
                              layouts=dict(al.layouts), scales=dict(al.scales),
                              unaligned=dict(al.unaligned), attributed=dict(al.attributed))
    changed, covers = {}, {}
    for name in names:
        pname = name if name in pal.pairs else float_name(name)
        want = pal.pairs.get(pname)
        if want is None:
            continue
        if name in al.pairs:
            covers[name] = pal.covers.get(pname, ())
            if want == al.pairs[name]:
                continue
        elif name in copied or (floats is not None and name not in floats):
            continue
        else:
            covers[name] = pal.covers.get(pname, ())
            out.considered += name in al.attributed  # counted as aligned now
            out.unaligned.pop(name, None)
            out.attributed.pop(name, None)
        changed[name] = out.pairs[name] = want
        for mine, theirs in ((out.relations, pal.relations), (out.layouts, pal.layouts),
                             (out.scales, pal.scales)):
            mine.pop(name, None)
            if pname in theirs:
                mine[name] = theirs[pname]
    return out, changed, covers
