"""Attention masks that ncnn's SDPA misreads: a boolean mask pnnx stored as raw bytes.

pnnx folds a constant boolean attention mask (torch's ``attn_mask=`` of
``F.scaled_dot_product_attention``: transformers' causal mask with its default "sdpa"
attention, or a ``torch.ones(L, L, dtype=torch.bool).tril()``) into a MemoryData layer with
``21=3``: the mask's bytes as they are, one per element. ncnn's SDPA adds its mask input to
the attention scores as float (``const float* mptr = maskm.row(i)`` in src/layer/sdpa.cpp at
ncnn a4d2ea1d4), so it reads four mask bytes as one float and runs past the mask's end.
Measured with pnnx 20261020 and ncnn 1.0.20261020: a 6x6 boolean mask crashes the process
(glibc: "malloc_consolidate(): invalid chunk size"); transformers' Llama and Qwen2 crash the
same way; GPT-NeoX runs, and its output is off by 2.1 on a range of 3.1. A float mask
(0 where attended, -inf where not) converts to an fp32 MemoryData and matches torch to
1e-7; transformers models give one with ``attn_implementation="eager"`` (Llama, Qwen2 and
GPT-NeoX then pass to_ncnn's output check). ``is_causal=True`` does not help here: pnnx
20261020 writes no ncnn layer for it.

Found from the graph alone, so ``to_ncnn`` names the cause even when the run crashes, and
``wb.compare`` says why its SDPA diverges. A run does not always crash: the worker then
lives on with a damaged heap, and an unrelated model run in it later crashed ("pool
allocator destroyed too early"). So ``NcnnRunner`` runs such a model in the worker only,
and the worker is replaced after it (``Worker.taint``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import Diagnostic
from ..params import NcnnParam

BYTES = "3"  # MemoryData's load type (param 21) for raw one-byte elements


@dataclass(frozen=True)
class ByteMask:
    """An SDPA layer whose mask input is a MemoryData of raw bytes."""

    layer: str  # the SDPA layer
    source: str  # the MemoryData layer
    shape: tuple[int, ...]  # the MemoryData's shape, outermost first (as torch writes it)


def byte_masks(graph: NcnnParam) -> list[ByteMask]:
    """Every SDPA of ``graph`` that takes its mask (``5=1``: the fourth input) from a
    MemoryData with ``21=3``, followed through Split layers; [] when none does."""
    by_name = {la.name: la for la in graph.layers}
    origin: dict[str, str] = {}  # blob -> the MemoryData layer it holds the bytes of
    for la in graph.layers:  # in order: a Split's input is known before the Split
        if la.type == "MemoryData" and str(la.params.get(21, "1")) == BYTES:
            origin.update({top: la.name for top in la.tops})
        elif la.type == "Split" and la.bottoms and la.bottoms[0] in origin:
            origin.update({top: origin[la.bottoms[0]] for top in la.tops})
    found = []
    for la in graph.layers:
        if la.type != "SDPA" or str(la.params.get(5, "0")) != "1" or len(la.bottoms) < 4:
            continue
        source = origin.get(la.bottoms[3])
        if source is not None:
            found.append(ByteMask(la.name, source, _shape(by_name[source])))
    return found


def _shape(layer: object) -> tuple[int, ...]:
    """A MemoryData's shape from its params (0=w 1=h 11=d 2=c), outermost first."""
    params = getattr(layer, "params", {})
    dims = [int(str(params.get(k, "0"))) for k in (2, 11, 1, 0)]
    return tuple(d for d in dims if d > 0)


def describe(masks: list[ByteMask]) -> str:
    """One phrase naming every such layer and its mask (layers sharing a mask together)."""
    by_source: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for m in masks:
        by_source.setdefault((m.source, m.shape), []).append(m.layer)
    return "; ".join(
        f"{', '.join(layers)} (SDPA) take{'s' if len(layers) == 1 else ''} "
        f"{'its' if len(layers) == 1 else 'their'} mask from {source} (MemoryData "
        f"{'x'.join(map(str, shape))}, 21=3: one raw byte per element)"
        for (source, shape), layers in by_source.items())


HINT = ("give the attention an additive float mask instead of a boolean one: 0 where a "
        "position is attended and -inf where not, e.g. torch.zeros(L, L).masked_fill("
        "~keep, float('-inf')); for a transformers model, load it with "
        "attn_implementation=\"eager\" (its mask is then float), and convert again")


def note(masks: list[ByteMask]) -> str:
    """The cause and the fix in one line: a crash's hint, a comparison's note."""
    return (f"{describe(masks)}: ncnn's SDPA reads its mask as float, so it computes with "
            f"garbage scores or crashes; {HINT}")


def byte_mask_diagnostic(masks: list[ByteMask]) -> Diagnostic:
    """The error ``to_ncnn`` records for ``masks`` (non-empty)."""
    return Diagnostic(
        "error", "ncnn-sdpa-byte-mask",
        f"{describe(masks)}: pnnx stored a boolean attention mask as bytes, and ncnn's SDPA "
        "reads its mask as float, four bytes at a time and past the mask's end: it computes "
        "with garbage scores, or crashes the process",
        HINT)
