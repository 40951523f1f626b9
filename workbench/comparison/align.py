"""Alignment: each candidate tensor mapped to the PyTorch module or call that produced it.

Names hint where they exist (TorchScript module scopes in value names,
``/layer1/layer1.0/conv1/Conv_output_0``; dynamo's ``pkg.torch.onnx.name_scopes`` metadata;
ncnn has none worth having): the match is by shape, topological order (monotone) and value,
which also maps a fused op (Conv + BatchNorm in ONNX, Conv + ReLU in ncnn) to the last module
it covers. Values are scored on a fixed sample of elements: cheap on large tensors.
Each candidate tensor ends up aligned (with its relation: equal, or up to a folding, with
the records it covers), attributed (a step inside a module or lowered op: torch computed no
such tensor to measure it against) or unaligned (with the reason).
A step is only aligned to a tensor it equals (within ACCEPT may be the output less its bias).
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from ..shapes import same_elements, squeezed, unbatched

WINDOW = 40  # how many reference tensors ahead of the last match a candidate may reach
ACCEPT = 0.05  # a value match needs max |a-b| / max |a| below this on the sample
# a shared pair this many times further from its reference than the closest one (and over
# TIGHT) is another state of a tensor written in place, whatever ACCEPT says
STATES = 20
TIGHT = 1e-3  # "equal" for a step inside a module: no bias or scale left out (those are >1%)
SAMPLE = 4096
CONSTANT_OPS = {"Constant", "ConstantOfShape", "MemoryData"}  # not counted as activations
# ops that move or relabel values without computing (ncnn and ONNX)
SHAPE_ONLY = {"Reshape", "Permute", "Flatten", "Squeeze", "Unsqueeze", "ExpandDims",
              "Transpose", "Identity"}
# ncnn layers without weights that stand for one torch call each (pnnx's conversion of it)
ONE_CALL = {"SDPA": "F.scaled_dot_product_attention"}
# ONNX ops a simplifier folds the weights of a module and of a scale after it into
WEIGHTED_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}


@dataclass
class CandidateTensor:
    name: str
    order: int
    op_type: str = ""
    hint: str | None = None  # a module path the name or metadata suggests
    internal: bool = False  # only read inside its own module (a step of a lowered op)
    output_index: int | None = None  # the model's k-th output: pairs with torch's output_k
    read_by_own: bool = False  # read by another node of its own module: not its output
    weights_of: tuple[str, ...] = ()  # modules whose weights its layer holds (ncnn)
    node: str = ""  # the node (ONNX) or layer (ncnn) that writes it
    inputs: tuple[str, ...] = ()  # what that node reads (ncnn: through Split aliases)
    # the hint is inferred (a scope without its list index, the owner of the weights it
    # reads), not named: it pins the tensor only to the module's own output
    hint_inferred: bool = False


@dataclass
class Alignment:
    """Every candidate tensor is in one of three places: ``pairs`` (aligned to a reference
    tensor; ``relations`` says how when not plainly equal, ``covers`` which modules a folded
    pair spans), ``attributed`` (a step inside a module, torch computed no such tensor) or
    ``unaligned`` (unexplained, with the reason; constants and index glue too)."""

    pairs: dict[str, str] = field(default_factory=dict)  # candidate name -> reference name
    unaligned: dict[str, str] = field(default_factory=dict)  # candidate name -> why
    attributed: dict[str, str] = field(default_factory=dict)  # candidate name -> module
    relations: dict[str, str] = field(default_factory=dict)  # candidate name -> relation
    covers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # folded: what it spans
    # candidate name -> axes: the candidate holds np.transpose(reference tensor, axes) (ncnn
    # keeps a batch-2 blob in a layout torch never held)
    layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # candidate name -> c: the candidate holds c * the reference tensor (a constant scale a
    # simplifier folded into the module's weights: SDPA's 1/sqrt(d) into a q projection)
    scales: dict[str, float] = field(default_factory=dict)
    considered: int = 0  # float tensors that could have aligned (attributed ones not counted)
    # candidate output -> why it is not compared with torch's output at its position (its
    # model computes something else there: a wrong verdict if left out of the count)
    outputs_unmatched: dict[str, str] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return len(self.pairs) / self.considered if self.considered else 0.0

    @property
    def explained_fraction(self) -> float:
        """Aligned or attributed, of the float activations (0.0 when there are none)."""
        total = self.considered + len(self.attributed)
        return (len(self.pairs) + len(self.attributed)) / total if total else 0.0

    def relation(self, name: str) -> str:
        return self.relations.get(name, "equal")

    def as_candidate(self, name: str, ref: Any) -> Any:
        """The reference array ``ref`` aligned with candidate tensor ``name`` as the
        candidate holds it: in its layout (``layouts``), times its folded scale
        (``scales``). What is measured, plotted and fed to an isolated run."""
        import numpy as np

        axes = self.layouts.get(name)
        if axes is not None:
            ref = np.transpose(ref, axes)
        scale = self.scales.get(name)
        if scale is not None:
            ref = np.multiply(ref, np.asarray(scale, dtype=np.asarray(ref).dtype))
        return ref


def weight_hint(weights_of: tuple[str, ...], calls: dict[str, list[int]],
                modules: set[str]) -> str | None:
    """The module a layer holding the weights of ``weights_of`` stands for: the last of them
    torch called (an attention's output projection), else the module that holds them all
    (an nn.MultiheadAttention, which calls no projection of its own)."""
    for m in reversed(weights_of):
        if m in calls:
            return m
    parts = [m.split(".") for m in weights_of]
    common: list[str] = []
    for group in zip(*parts, strict=False):
        if len(set(group)) != 1:
            break
        common.append(group[0])
    parent = ".".join(common)
    return parent if parent and parent in modules else None


def module_from_scope(value_name: str, modules: set[str]) -> str | None:
    """'/layer1/layer1.0/conv1/Conv_output_0' -> 'layer1.0.conv1' when that module exists.

    Scope parts of nn.Sequential children repeat the parent ('layer/layer.0'): a part that
    starts with the previous part and a dot replaces it.
    """
    folded = _scope_parts(value_name)
    if folded is None:
        return None
    if not folded:  # '/Resize_output_0': a call made by the model's own forward()
        return ""
    for start in range(len(folded)):  # the exporter may add an outer scope
        name = _module_called(".".join(folded[start:]), modules)
        if name is not None:
            return name
    return None


def _scope_parts(value_name: str) -> list[str] | None:
    """The scope of a TorchScript-exported value, Sequential repeats folded; [] for the
    model's own forward(), None for a name without one."""
    parts = [p for p in value_name.split("/")[:-1] if p]
    if not parts:
        return [] if value_name.startswith("/") else None
    folded: list[str] = []
    for p in parts:
        if folded and p.startswith(folded[-1] + "."):
            folded[-1] = p
        else:
            folded.append(p)
    return folded


def listed_modules(modules: set[str]) -> dict[tuple[str, ...], list[str]]:
    """{a module path without its list indices (and without the list's own name): the
    modules it stands for, in index order}, for modules inside a ModuleList:
    ('encoder', 'attention', 'query') -> ['encoder.layers.0.attention.query',
    'encoder.layers.1.attention.query']. Some exported scopes drop the index (SqueezeBERT:
    '/model/encoder/attention/query_1/Conv' is layer 1's query; see ``listed_scope``)."""
    out: dict[tuple[str, ...], list[tuple[tuple[int, ...], str]]] = {}
    for m in modules:
        parts = m.split(".")
        index = tuple(int(p) for p in parts if p.isdigit())
        if not index:
            continue
        no_index = tuple(p for p in parts if not p.isdigit())
        no_list = tuple(p for i, p in enumerate(parts) if not p.isdigit() and not (
            i + 1 < len(parts) and parts[i + 1].isdigit()))
        for key in {no_index, no_list}:
            out.setdefault(key, []).append((index, m))
    return {k: [m for _, m in sorted(v)] for k, v in out.items()}


def listed_scope(value_name: str, listed: dict[tuple[str, ...], list[str]]
                 ) -> tuple[tuple[str, ...], int] | None:
    """(the ``listed_modules`` key a scope without list indices names, k): the exporter
    numbers the k-th scope of one path ('query_1': k = 1), which is the k-th module of the
    list only when each is called once; the caller checks that over the whole graph."""
    folded = _scope_parts(value_name)
    if not folded:
        return None
    last, k = folded[-1], 0
    m = _CALL.search(last)
    if m:
        k, last = int(m.group()[1:]), last[:m.start()]
    for start in range(len(folded)):
        key = (*folded[start:-1], last)
        if key in listed:
            return key, k
    return None


_CALL = re.compile(r"_\d+$")


def _module_called(name: str, modules: set[str]) -> str | None:
    """The module a scope names: itself, or, for a module called again ('relu_1': the
    exporter numbers the scope of each further call), the module without the number."""
    if name in modules:
        return name
    base = ".".join(_CALL.sub("", p) for p in name.split("."))
    return base if base != name and base in modules else None


def call_module(record: str) -> str:
    """'relu#1' (the second call of leaf relu) -> 'relu'; other names as they are."""
    return record.split("#", 1)[0] if "#" in record and "/" not in record else record


def module_from_metadata(node: Any, modules: set[str]) -> str | None:
    """The innermost module of a dynamo-exported node's name_scopes metadata."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = re.findall(r"'([^']*)'", prop.value)
            for s in reversed(scopes):
                found = _module_called(s, modules)
                if found is not None:
                    return found
    return None


RUN = 64  # a sample is SAMPLE // RUN runs of RUN consecutive elements


@functools.lru_cache(maxsize=256)
def _sample_idx(size: int) -> Any:
    """Fixed positions to sample from an array of ``size`` elements: runs of consecutive
    elements at seeded random places, so a sample reads a few dozen cache lines of a large
    tensor rather than thousands (scattered single elements took most of align's time)."""
    import numpy as np

    if size <= SAMPLE:
        return slice(None)
    starts = np.sort(np.random.default_rng(0).choice(size // RUN, SAMPLE // RUN,
                                                     replace=False)) * RUN
    return (starts[:, None] + np.arange(RUN)).reshape(-1)


@dataclass
class Sample:
    """A fixed sample of an array's elements as float64, and what scoring needs of it."""

    values: Any
    finite: bool  # every sampled value finite
    scale: float  # max |value| (over the finite ones)


def _sample(arr: Any) -> Sample:
    import numpy as np

    a = np.asarray(arr).reshape(-1)
    v = a[_sample_idx(a.size)].astype(np.float64)
    fin = np.isfinite(v)
    finite = bool(fin.all())
    scale = float(np.abs(v if finite else v[fin]).max()) if v.size and fin.any() else 0.0
    return Sample(v, finite, scale)


def samples(arrays: dict[str, Any], into: dict[str, Sample] | None = None) -> dict[str, Sample]:
    """The samples align scores, of every float array: taken ahead of align, e.g. while
    the other side is still being captured."""
    import numpy as np

    out = {} if into is None else into
    for name, arr in arrays.items():
        if name not in out and np.asarray(arr).dtype.kind == "f":
            out[name] = _sample(arr)
    return out


def _score(ref: Sample, cand: Sample) -> float:
    """max |a-b| / max |a| over the samples of two arrays of one size."""
    import numpy as np

    if ref.finite and cand.finite:  # the common case: two passes over 4096 values
        return float(np.abs(ref.values - cand.values).max() / (ref.scale + 1e-6)) \
            if ref.values.size else 0.0
    a, b = ref.values, cand.values
    fa, fb = np.isfinite(a), np.isfinite(b)
    # NaN/Inf must sit at the same places with the same values; the rest is scored
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        return float("inf")
    a, b = a[fa], b[fb]
    if not a.size:
        return 0.0
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-6))


def align(reference: dict[str, Any], candidate: dict[str, Any],
          tensors: list[CandidateTensor], modules: set[str] | None = None,
          ref_samples: dict[str, Sample] | None = None,
          cand_samples: dict[str, Sample] | None = None) -> Alignment:
    """Pair candidate tensors (in topological order) with reference tensors (in execution
    order). ``reference`` and ``candidate`` map names to arrays; ``modules`` are the
    reference model's module names (a record that is not one is a functional call).
    ``ref_samples`` keeps the reference samples for the next candidate of the same run;
    ``cand_samples`` may hold the candidate's, taken ahead (see ``samples``).

    A tensor named for a module is that module's output (pinned by name and shape, whatever
    its values, so that a fault is blamed where it is), or a later record folded into it
    (a layer-scale multiply, a BatchNorm) when it equals that one instead. A step inside a
    module (read by another node of the same module: a MatMul before its bias Add, a
    Reshape before a Gemm) is never measured against the module's output: it is aligned
    only when it equals an earlier tensor (the module's input, reshaped), else attributed
    to the module."""
    import numpy as np

    modules = modules or set()
    ref_names = list(reference)
    ref_keys = [unbatched(np.shape(reference[n])) for n in ref_names]
    ref_squeezed = [squeezed(np.shape(reference[n])) for n in ref_names]
    # (size, last axis): a Gemm's 2-D output is its Linear's [1, H, W, C] with axes merged
    ref_flat = [(np.size(reference[n]), np.shape(reference[n])[-1:]) for n in ref_names]
    # the module each record belongs to: a leaf is its own (each of its calls: relu,
    # relu#1); 'layer1/Tensor.add_0' was called by layer1; 'F.interpolate_0' by the model
    ref_module = [m if (m := call_module(n)) in modules else (n.split("/")[0] if "/" in n
                                                              else _tuple_of(n, modules))
                  for n in ref_names]
    calls: dict[str, list[int]] = {}  # leaf module -> the indices of its calls
    for j, (n, m) in enumerate(zip(ref_names, ref_module, strict=True)):
        if call_module(n) == m:
            calls.setdefault(m, []).append(j)
    # a reference tensor is scored against many candidate tensors
    samples = {} if ref_samples is None else ref_samples

    def ref_sample(j: int) -> Sample:
        name = ref_names[j]
        if name not in samples:
            samples[name] = _sample(reference[name])
        return samples[name]

    out = Alignment()
    low = 0  # monotone lower bound in the reference order
    taken: set[int] = set()  # module calls a named tensor was pinned to
    # torch's output_k is some earlier record returned as it was: name that record instead
    alias: dict[str, str] = {}
    for k, n in enumerate(ref_names):
        if n.startswith("output_"):
            same = [m for m in ref_names[:k] if not m.startswith("output_")
                    and np.shape(reference[m]) == np.shape(reference[n])
                    and np.array_equal(reference[m], reference[n], equal_nan=True)]
            alias[n] = same[-1] if same else n
    for t in sorted(tensors, key=lambda t: t.order):
        arr = candidate.get(t.name)
        if arr is None:
            out.unaligned[t.name] = "not captured"
            continue
        if t.op_type in CONSTANT_OPS:
            out.unaligned[t.name] = "a constant (a parameter, not an activation)"
            continue
        if np.asarray(arr).dtype.kind != "f":
            out.unaligned[t.name] = f"{np.asarray(arr).dtype} tensor (shape or index glue)"
            continue
        out.considered += 1
        key = unbatched(np.shape(arr))
        wanted = f"output_{t.output_index}" if t.output_index is not None else None
        if wanted in alias and (unbatched(np.shape(reference[wanted])) == key or same_elements(
                np.shape(reference[wanted]), np.shape(arr))):
            out.pairs[t.name] = alias[wanted]  # outputs pair by position, whatever the values
            continue

        def cand_sample(name: str = t.name, arr: Any = arr) -> Sample:
            return (cand_samples or {}).get(name) or _sample(arr)

        def scored(choices: list[int], cand_sample: Any = cand_sample) -> list:
            got = cand_sample()
            return sorted((_score(ref_sample(j), got), j) for j in choices)

        if t.hint is not None and t.hint in calls and (t.read_by_own or t.internal):
            # a step inside a leaf module: torch kept no tensor of it, and the module's
            # output is not its value. Equal to what came before (the module's input,
            # reshaped), it is that; otherwise attributed to the module.
            own = calls[t.hint]
            k = bisect.bisect_left(own, low)
            end = own[k] if k < len(own) else min(len(ref_names), low + WINDOW)
            before = [j for j in range(max(low, end - WINDOW), end) if ref_keys[j] == key]
            best = scored(before)[:1]
            if best and best[0][0] <= TIGHT:
                j = best[0][1]
                out.pairs[t.name] = ref_names[j]
                out.relations[t.name] = f"equal: the input of {t.hint} (a step inside it)"
                low = j
            else:
                _attribute(out, t, t.hint)
            continue
        window = range(low, min(len(ref_names), low + WINDOW))
        fn = ONE_CALL.get(t.op_type) if t.hint is None and not t.weights_of else None
        if fn is not None:
            # a weightless layer that is one torch call: pinned to the next such call of its
            # shape, whatever its values, so that a layer computing wrongly is measured
            # where it is (ncnn's SDPA over a misread mask: GPT-NeoX was blamed on the
            # attention's output projection, the next tensor pinned by its weights)
            own = [j for j in window if ref_keys[j] == key and j not in taken
                   and _call_of(ref_names[j]) == fn]
            if own:
                out.pairs[t.name] = ref_names[own[0]]
                taken.add(own[0])
                low = max(low, own[0])
                continue
        flat = (np.size(arr), np.shape(arr)[-1:])
        # the same shape; or the same but for size-1 axes; or leading axes merged (ncnn's
        # Reshape to [H*W, C] before a Gemm): the values decide which, if any, it is
        choices = [j for j in window if ref_keys[j] == key] or [
            j for j in window if ref_squeezed[j] == squeezed(np.shape(arr))] or [
            j for j in window if ref_flat[j] == flat]
        structural = None  # the record name and shape pin, whatever the values say
        # an ncnn layer has no name, but its weights say which module it is
        hint = t.hint if t.hint is not None else (
            weight_hint(t.weights_of, calls, modules) if t.weights_of else None)
        hinted: list[int] = []
        if hint is not None:
            hinted = _hinted(hint, key, low, ref_names, ref_keys, ref_module, modules,
                             calls, taken)
            if not hinted and hint in calls:  # the call's output with leading axes merged
                hinted = _hinted(hint, flat, low, ref_names, ref_flat, ref_module, modules,
                                 calls, taken)
            if not hinted and t.weights_of:  # size-1 axes dropped ([C] for [1, C, 1, 1])
                hinted = _hinted(hint, squeezed(np.shape(arr)), low, ref_names,
                                 ref_squeezed, ref_module, modules, calls, taken)
            if hinted:
                choices = hinted
                # the named module itself, unless this is a step inside a lowered module
                # (those need a value match) or the name fits several calls equally
                if not t.internal and ((len(hinted) == 1 and not t.hint_inferred)
                                       or call_module(ref_names[hinted[0]]) == hint):
                    structural = hinted[0]
        scores = scored(choices) if choices else []
        best, j = scores[0] if scores else (float("inf"), -1)
        if structural is not None and j != structural:
            own = next(s for s, k in scores if k == structural)
            if own <= TIGHT:  # the module's own output wins a tie with what follows it
                best, j = own, structural
        if best > TIGHT and t.internal:
            # a step of an op the exporter lowered (attention, GELU...): torch ran it as one
            # call, no torch tensor to align with. Attributed, not counted. Only an equal
            # tensor is the step's (the scores before a softmax are within 5% of the mask).
            _attribute(out, t, t.hint or "")
            continue
        if not choices:
            if _layout_pair(out, t.name, arr, window, reference, ref_names):
                low = max(low, ref_names.index(out.pairs[t.name]))
                continue
            out.unaligned[t.name] = f"no reference tensor of shape {list(np.shape(arr))} nearby"
            continue
        # a poor value match is kept only when name and shape leave no other choice (a real
        # divergence at a module); otherwise it is listed, not guessed
        if best > ACCEPT and structural is None:
            # the same elements in another shape (ncnn's ShuffleChannel for torch's
            # reshape-permute-reshape): the values decide
            other = scored([k for k in window if k not in choices and (
                ref_squeezed[k] == squeezed(np.shape(arr)) or ref_flat[k] == flat)])
            if other and other[0][0] <= ACCEPT:
                best, j = other[0]
        if best > ACCEPT:
            if structural is None:
                if _layout_pair(out, t.name, arr, window, reference, ref_names):
                    low = max(low, ref_names.index(out.pairs[t.name]))
                    continue
                out.unaligned[t.name] = (f"nearest reference tensor {ref_names[j]!r} differs "
                                         f"by {best:.2g} of its range")
                continue
            if t.hint is not None:
                j = structural
            else:
                # pinned by its weights: the module's own output or what folded into it,
                # whichever is nearest (a damaged fused Conv+ReLU is nearest the ReLU's) --
                # unless another tensor nearby equals it: then it is that one
                other = scored([k for k in window if ref_keys[k] == key and k not in hinted])
                if other and other[0][0] <= ACCEPT:
                    j, structural = other[0][1], None
        out.pairs[t.name] = ref_names[j]
        if structural is not None and j == structural:  # pinned to the named module
            scale = _folded_scale(ref_sample(j), cand_sample()) if (
                best > TIGHT and t.output_index is None) else None
            if scale is not None:
                out.scales[t.name] = scale
                out.relations[t.name] = (f"equal up to a scale folded in: x{scale:.6g} "
                                         "(a constant multiply folded into the weights, as "
                                         "an attention's 1/sqrt(d))")
            # named for a module that follows a weighted one whose own output has no tensor
            # here: DINOv2's fc2 MatMul, its layer scale folded in, carries layer_scale2's
            # name. It covers fc2 too, so that a damaged fc2 is named there.
            prev = structural - 1
            if prev >= 0 and t.op_type in WEIGHTED_OPS and not t.weights_of \
                    and ref_keys[prev] == key and call_module(ref_names[prev]) in modules \
                    and prev not in taken and ref_names[prev] not in out.pairs.values():
                out.covers[t.name] = (ref_names[prev], ref_names[structural])
                out.relations.setdefault(t.name, (
                    f"equal up to folding: {ref_names[structural]} folded into "
                    f"{ref_names[prev]}"))
        if structural is not None:
            taken.update(range(structural, j + 1))
            if j > structural:
                folded = ref_names[structural + 1:j + 1]
                out.relations[t.name] = (f"equal up to folding: {', '.join(folded)} folded "
                                         f"into {ref_names[structural]}")
            spans = (*t.weights_of, *ref_names[structural:j + 1])
            if j > structural or len(t.weights_of) > 1:
                # a fused layer: every module whose weights it holds, and the records it spans
                out.covers[t.name] = tuple(dict.fromkeys(spans))
        low = max(low, j)  # a named call found behind low leaves the order where it was
    _check_shared(out, reference, candidate)
    _pin_gaps(out, tensors, reference, candidate, ref_names, ref_keys, calls)
    _attribute_between(out, tensors, ref_names, ref_module, calls)
    _attribute_feeders(out, tensors, ref_module, {n: j for j, n in enumerate(ref_names)})
    _check_outputs(out, tensors, reference, candidate, alias)
    return out


def _check_outputs(out: Alignment, tensors: list[CandidateTensor], reference: dict[str, Any],
                   candidate: dict[str, Any], alias: dict[str, str]) -> None:
    """Record each candidate output (pnnx's out<k>, an ONNX graph output) that is not
    compared with torch's output k: one of another size, or equal to some other tensor (an
    EfficientNet pool that ncnn left a no-op returned the 1280 values before it, aligned by
    value to them, where torch returns 320). Such a model computes something else: counting
    only what did align would say "all within tolerance"."""
    import numpy as np

    for t in tensors:
        wanted = f"output_{t.output_index}" if t.output_index is not None else None
        if wanted not in alias or t.name not in candidate or \
                np.asarray(candidate[t.name]).dtype.kind != "f":
            continue
        got = out.pairs.get(t.name)
        if got in (wanted, alias[wanted]) or (got is not None and np.array_equal(
                reference[got], reference[wanted], equal_nan=True)):
            continue  # torch's output, or a record holding exactly its values
        shapes = (f"candidate {list(np.shape(candidate[t.name]))}, torch's {wanted} "
                  f"{list(np.shape(reference[wanted]))}")
        out.outputs_unmatched[t.name] = (
            f"aligned to {got!r}, not to torch's {wanted} ({shapes})" if got is not None
            else f"matches no reference tensor ({shapes})") + _unaligned_chain(out, t, tensors)


def _unaligned_chain(out: Alignment, last: CandidateTensor,
                     tensors: list[CandidateTensor]) -> str:
    """'; computed by <the nodes back to the nearest aligned tensors>': where to look."""
    by_name = {t.name: t for t in tensors}
    steps, good, todo, seen = [], [], [last.name], set()
    while todo and len(steps) < 6:
        name = todo.pop()
        t = by_name.get(name)
        if name in seen or t is None:
            continue
        seen.add(name)
        if name != last.name and name in out.pairs:
            good.append(f"{name} (aligned to {out.pairs[name]})")
            continue
        steps.append(f"{t.node or t.name} ({t.op_type})")
        todo.extend(t.inputs)
    if not steps:
        return ""
    return (f"; computed by {', '.join(reversed(steps))}"
            + (f" from {', '.join(good)}" if good else ""))


MAX_LAYOUT_SIZE = 1 << 22  # elements: larger tensors are not searched for a permuted layout


def _layout_pair(out: Alignment, name: str, arr: Any, window: range,
                 reference: dict[str, Any], ref_names: list[str]) -> bool:
    """Pair ``name`` with the reference tensor in ``window`` that it equals with its axes
    permuted (every element compared), recording the axes in ``out.layouts``; False when
    none does. Only axes of other sizes than 1 are moved (the rest is ``same_elements``)."""
    import itertools

    import numpy as np

    shape = tuple(np.shape(arr))
    if not 2 <= len(shape) <= 5 or np.size(arr) > MAX_LAYOUT_SIZE:
        return False
    b = np.asarray(arr, dtype=np.float64)
    for j in window:
        ref = reference[ref_names[j]]
        rshape = tuple(np.shape(ref))
        if len(rshape) != len(shape) or sorted(rshape) != sorted(shape) or rshape == shape:
            continue
        a_all = np.asarray(ref, dtype=np.float64)
        for axes in itertools.permutations(range(len(shape))):
            moved = [k for k, ax in enumerate(axes) if ax != k]
            if (tuple(rshape[ax] for ax in axes) != shape
                    or all(rshape[axes[k]] == 1 for k in moved)):
                continue
            a = np.transpose(a_all, axes)
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                continue
            scale = float(np.abs(a).max()) if a.size else 0.0
            if a.size and float(np.abs(a - b).max()) / (scale + 1e-6) <= ACCEPT:
                out.pairs[name] = ref_names[j]
                out.layouts[name] = tuple(axes)
                out.relations[name] = (f"equal up to a layout: the reference's axes in the "
                                       f"order {list(axes)}")
                return True
    return False


def _check_shared(out: Alignment, reference: dict[str, Any], candidate: dict[str, Any]
                  ) -> None:
    """Several candidate tensors paired with one reference tensor by their samples alone
    (successive states of a tensor written in place: each slice assignment a CopyTo in
    ncnn) may differ where no sample looked. Those are checked on every element; when one
    of them equals the reference, one that differs by more than ACCEPT is unaligned with
    the reason, not measured as a divergence.
    Only shared pairs are checked, so a comparison pays for this only where it happens."""
    import numpy as np

    by_ref: dict[str, list[str]] = {}
    for c, r in out.pairs.items():
        if out.relation(c) == "equal":
            by_ref.setdefault(r, []).append(c)
    for ref_name, names in by_ref.items():
        if len(names) < 2:
            continue
        a = np.asarray(reference[ref_name], dtype=np.float64).reshape(-1)
        scale = float(np.abs(a[np.isfinite(a)]).max()) if np.isfinite(a).any() else 0.0
        worst: dict[str, float] = {}
        for c in names:
            b = np.asarray(candidate[c], dtype=np.float64).reshape(-1)
            if b.size != a.size:
                continue
            with np.errstate(invalid="ignore"):
                diff = np.abs(a - b)
            worst[c] = float(np.nanmax(diff)) / (scale + 1e-6) if diff.size else 0.0
        if not worst:
            continue
        closest = min(worst, key=worst.__getitem__)
        if worst[closest] > ACCEPT:
            # no state of it equals the reference: not a tensor written in place but a
            # divergence (ncnn's pow returning 2e38 for negative bases, a few elements the
            # samples missed): kept, measured, named
            continue
        for c, w in worst.items():
            if w > ACCEPT:
                out.unaligned[c] = (f"equal to {ref_name!r} on a sample only: differs by "
                                    f"{w:.2g} of its range elsewhere (an earlier state of "
                                    "a tensor written in place?)")
            elif w > TIGHT and w > STATES * worst[closest]:
                # within ACCEPT, but far from the state that equals the reference: another
                # state of the tensor (a slice written by +1 on a range of 21 is 4.8%)
                out.unaligned[c] = (f"equal to {ref_name!r} on a sample only: another state "
                                    f"of it, differs by {w:.2g} of its range where "
                                    f"{closest!r} differs by {worst[closest]:.2g} (a tensor "
                                    "written in place?)")
            else:
                continue
            del out.pairs[c]


def _attribute_feeders(out: Alignment, tensors: list[CandidateTensor],
                       ref_module: list[str], index: dict[str, int]) -> None:
    """An unexplained tensor read only by one module's steps or outputs (an initial LSTM
    state's per-layer slices, a lowered torch.roll's pieces, F.logsigmoid's Sigmoid) is a
    step of it, attributed; repeated, so a chain of glue (Concat, Slices) goes with it."""
    readers: dict[str, list[str]] = {}
    for t in tensors:
        for name in t.inputs:
            readers.setdefault(name, []).append(t.name)
    node_of = {t.name: t.node for t in tensors}

    def owner(name: str) -> str | None:
        # a layer with a top attributed to one module is its step, whatever its other tops
        # pair with (an RNN's last layer, its output a model output)
        steps = {m for n, m in out.attributed.items() if m and node_of.get(n) == node_of.get(
            name, "") != ""}
        if len(steps) == 1 or name in out.attributed:
            return steps.pop() if len(steps) == 1 else (out.attributed[name] or None)
        if name in out.pairs and out.pairs[name] in index:
            # a module's record, or a functional call of the model itself (torch.roll_0)
            return ref_module[index[out.pairs[name]]] or out.pairs[name]
        return None

    changed = True
    while changed:
        changed = False
        for t in tensors:
            # no torch counterpart; or no name or weights tie it to a module: a step of the
            # call alone reading it (its error shows there). Named or weighted: listed. Near
            # a record but not it: a partial sum of a sum pnnx added up in another order
            # (FocalNet's modulation: (a + b) + c for torch's a + (b + c)) is, on a sample,
            # "equal" to the whole sum, which its reader's output equals exactly.
            why = out.unaligned.get(t.name, "")
            near = why.startswith("nearest reference tensor") or (
                why.startswith("equal to ") and " on a sample only" in why)
            if not why.startswith("no reference tensor") and (t.hint is not None or (
                    t.weights_of or not near)):
                continue
            owners = {owner(r) for r in readers.get(t.name, ())}
            if len(owners) == 1 and None not in owners:
                del out.unaligned[t.name]
                _attribute(out, t, owners.pop())
                changed = True


def _pin_gaps(out: Alignment, tensors: list[CandidateTensor], reference: dict[str, Any],
              candidate: dict[str, Any], ref_names: list[str], ref_keys: list[tuple],
              calls: dict[str, list[int]]) -> None:
    """Between a tensor aligned to record k and the next aligned to record k + 2, torch
    computed one tensor, k + 1. When that is a module's call (not equal to either
    neighbour), the candidate's steps in between compute it: the last of them with its
    shape (back through Reshape/Permute to the op that made it) is pinned to it, whatever
    its values. A lowered module that computes wrongly is then measured where it is:
    GPT-2's tanh GELU in ncnn, whose pow layer returns garbage for negative bases, was
    blamed on the next Linear (c_proj), its input being a step attributed to it."""
    import numpy as np

    index = {n: j for j, n in enumerate(ref_names)}
    ordered = sorted(tensors, key=lambda t: t.order)
    by_name = {t.name: t for t in ordered}
    aligned = [(t.order, index[out.pairs[t.name]]) for t in ordered if t.name in out.pairs
               and out.pairs[t.name] in index]
    pinned = set(out.pairs.values())
    # float activations left unmatched (not constants, not index glue), in candidate order
    loose = [t for t in ordered if out.unaligned.get(t.name, "").startswith(
        ("no reference tensor", "nearest reference tensor"))]
    loose_orders = [t.order for t in loose]
    for (o1, j1), (o2, j2) in zip(aligned, aligned[1:], strict=False):
        r = j1 + 1
        if j2 != j1 + 2 or ref_names[r] in pinned or call_module(ref_names[r]) not in calls:
            continue
        lo, hi = bisect.bisect_right(loose_orders, o1), bisect.bisect_left(loose_orders, o2)
        gap = [t for t in loose[lo:hi] if t.name in out.unaligned
               and unbatched(np.shape(candidate[t.name])) == ref_keys[r]]
        if not gap:
            continue
        b = reference[ref_names[r]]
        if any(np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=True)
               for a in (reference[ref_names[j1]], reference[ref_names[j2]])):
            # k + 1 equals a neighbour (T5's dropout after the embedding, or the dropout
            # after its final RMSNorm): the candidate's tensor for it is the one already
            # aligned, and the steps in the gap are another call's (an RMSNorm's square)
            continue
        t = gap[-1]
        while t.op_type in SHAPE_ONLY and len(t.inputs) == 1 and (
                prev := by_name.get(t.inputs[0])) is not None and prev in gap:
            t = prev
        del out.unaligned[t.name]
        out.pairs[t.name] = ref_names[r]
        out.relations[t.name] = (f"equal: the one record between {ref_names[j1]} and "
                                 f"{ref_names[j2]} (pinned by place)")
        pinned.add(ref_names[r])


def _attribute_between(out: Alignment, tensors: list[CandidateTensor],
                       ref_names: list[str], ref_module: list[str],
                       calls: dict[str, list[int]]) -> None:
    """Unaligned tensors between a tensor aligned to reference record k and the next one
    aligned to record k + 1 are steps of the call that made k + 1 (the permute-LayerNorm-
    permute of a channels-first LayerNorm that ncnn runs as three layers): torch kept no
    tensor between the two, so nothing is there to measure them against. Attributed to
    that call's module; a gap with records in between stays unexplained."""
    index = {n: j for j, n in enumerate(ref_names)}
    ordered = sorted(tensors, key=lambda t: t.order)
    aligned = [(t.order, index[out.pairs[t.name]]) for t in ordered if t.name in out.pairs
               and out.pairs[t.name] in index]
    orders = [o for o, _ in aligned]
    for t in ordered:
        if t.name not in out.unaligned or not out.unaligned[t.name].startswith(
                ("no reference tensor", "nearest reference tensor")):
            continue
        k = bisect.bisect_left(orders, t.order)
        if k == 0 or k >= len(aligned) or orders[k] == t.order:
            continue
        before, after = aligned[k - 1][1], aligned[k][1]
        if after != before + 1:
            continue
        name = ref_names[after]
        module = call_module(name) if call_module(name) in calls else ref_module[after]
        del out.unaligned[t.name]
        _attribute(out, t, module or name)


def _call_of(record: str) -> str:
    """The function a functional record calls: 'a.b/F.scaled_dot_product_attention_0' ->
    'F.scaled_dot_product_attention'."""
    return re.sub(r"_\d+$", "", record.rsplit("/", 1)[-1])


def _tuple_of(name: str, modules: set[str]) -> str:
    """'lstm.1' (the second element of a module's tuple output) -> 'lstm'; else ''."""
    base, _, k = name.rpartition(".")
    base = call_module(base)
    return base if k.isdigit() and base in modules and name not in modules else ""


def _folded_scale(ref: Sample, cand: Sample) -> float | None:
    """c when the candidate's sample is c * the reference's (to TIGHT of its range) for a
    constant c other than 1, else None. A simplifier folds a constant multiply that follows
    a module into its weights (onnxslim: SDPA's scale into the q projection); torch has no
    tensor of the product. A damaged weight is no multiple of the reference: it stays a
    divergence at the module."""
    import numpy as np

    a, b = ref.values, cand.values
    if not (ref.finite and cand.finite) or not a.size:
        return None
    aa = float(a @ a)
    if not aa > 0:
        return None
    c = float(np.float32(float(a @ b) / aa))  # the folded constant is a float32
    if not np.isfinite(c) or c == 0 or abs(c - 1) <= TIGHT:
        return None
    resid = float(np.abs(b - c * a).max()) / (float(np.abs(b).max()) + 1e-6)
    return c if resid <= TIGHT else None


def _attribute(out: Alignment, t: CandidateTensor, module: str) -> None:
    """A step inside ``module``: listed there, not counted as unaligned."""
    out.considered -= 1
    out.attributed[t.name] = module


def _hinted(hint: str, key: Any, low: int, ref_names: list[str],
            ref_keys: list[Any], ref_module: list[str], modules: set[str],
            calls: dict[str, list[int]], taken: set[int]) -> list[int]:
    """Reference tensors a hinted candidate may be: the hinted module's own output (its
    next call not yet taken; behind the order so far when none is ahead: a simplified
    graph may run a shortcut conv before the branch torch ran first), and for a module,
    the records that follow it in its parent (a Conv whose value is its BatchNorm's after
    folding, a Linear with a layer-scale multiply folded in, or its activation's after
    fusion); for the model itself ("") or a non-leaf module, the calls it made. Model
    outputs (output_N) repeat other records."""
    if hint in calls:
        free = [j for j in calls[hint] if j not in taken and ref_keys[j] == key]
        ahead = [j for j in free if j >= low]
        if not free:
            return []
        h = ahead[0] if ahead else free[-1]
    else:
        def mine(span: range) -> list[int]:
            return [j for j in span if ref_keys[j] == key and ref_module[j] == hint
                    and j not in taken and not ref_names[j].startswith("output_")]

        # ahead of the order so far, or (a branch the simplified graph ran second) behind
        own = mine(range(low, len(ref_names))) or mine(range(low))[-1:]
        return own[:1] if len(own) == 1 else own
    # its parent and every module above it: BEiT scales o_proj's output by lambda_1 in the
    # layer two levels up (o_proj, the layer's dropout, then `lambda_1 * x`), a multiply a
    # simplifier folds into o_proj's weights
    parts = hint.split(".")
    above = {".".join(parts[:k]) for k in range(len(parts))}
    follow = []
    for j in range(h + 1, min(len(ref_names), h + 3)):
        name = ref_names[j]
        if ref_keys[j] == key and not name.startswith("output_") and (
                (call_module(name) in modules and any(
                    a == "" or name.startswith(a + ".") for a in above))
                or ref_module[j] in above):
            follow.append(j)
        else:
            break
    return [h, *follow]
