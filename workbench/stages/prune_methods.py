"""The two ways to prune a module in place: whole channels with torch-pruning's dependency
graph (L1 importance), or single weights with ``torch.nn.utils.prune`` (L1, made permanent).

``amount`` means the same for both: the fraction of the Conv and Linear weights to take
away — removed with their channels (structured) or set to zero (unstructured). torch-pruning
takes a *channel* ratio, and a conv loses its weights in both its dimensions, so the ratio
that removes ``amount`` of the weights is found from one probe (see ``_solve_ratio``).
torch and torch_pruning are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

METHODS = ("l1-structured", "l1-unstructured")
# a probe whose removed fraction is this close to the amount is kept (no second pruning)
RATIO_TOLERANCE = 0.01
MAX_TRIALS = 4  # prunings tried (one trace each) in search of the channel ratio


@dataclass
class Pruned:
    """What a method did to the module: the channel ratio torch-pruning was given (None for
    unstructured), the fraction of Conv/Linear weights removed or zeroed, the layers kept
    whole (by name) and the layers whose output is the model's output (kept their width)."""

    channel_ratio: float | None
    weights_pruned: float
    ignored: list[str]
    output_layers: list[str]


def weight_layers(model: Any) -> dict[str, Any]:
    """{name: module} of the Conv (any rank, transposed too) and Linear layers of ``model``."""
    from torch import nn

    kinds = (nn.modules.conv._ConvNd, nn.Linear)
    return {n: m for n, m in model.named_modules() if isinstance(m, kinds)
            and isinstance(getattr(m, "weight", None), nn.Parameter)}


def flat_tensors(value: Any) -> list[Any]:
    """The tensors in a forward's result (a tensor, tuple/list, dict or ModelOutput)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat_tensors(v)]
    return []


def output_layers(model: Any, inputs: tuple) -> list[str]:
    """Names of the weight layers whose output channels are the model's output channels.

    The pattern: walking back from each output through autograd's graph, the first Conv or
    Linear output met on every path. Ops in between (activations, pooling, flatten, a
    residual add, a channel-wise norm) keep channels where they are, so pruning that layer's
    outputs would change the shape of what the model returns: torch-pruning is told to
    leave them (a classifier's last Linear, a detector head's convs)."""
    import torch

    by_fn: dict[Any, str] = {}
    hooks = [m.register_forward_hook(
        lambda _m, _i, out, name=name: by_fn.update(
            {t.grad_fn: name for t in flat_tensors(out) if t.grad_fn is not None}))
        for name, m in weight_layers(model).items()]
    flags = {p: p.requires_grad for p in model.parameters()}
    try:
        for p in flags:
            p.requires_grad_(True)
        with torch.enable_grad():
            outs = flat_tensors(model(*inputs))
    finally:
        for h in hooks:
            h.remove()
        for p, flag in flags.items():
            p.requires_grad_(flag)
    if not any(t.grad_fn is not None for t in outs):
        raise ValueError("the forward's outputs carry no autograd graph (computed under "
                         "torch.no_grad / inference_mode, or detached), so no layer can be "
                         "followed to them")
    found: set[str] = set()
    stack, seen = [t.grad_fn for t in outs if t.grad_fn is not None], set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if fn in by_fn:
            found.add(by_fn[fn])
            continue
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return sorted(found)


def prune_unstructured(model: Any, amount: float, ignored: Iterable[str]) -> Pruned:
    """Zero the ``amount`` smallest-|w| fraction of each Conv/Linear weight not ``ignored``
    (``prune.l1_unstructured``), then ``prune.remove``: the zeros stay, the masks and hooks
    go, so the module is a plain one again that exports as any other."""
    from torch.nn.utils import prune

    skip = set(ignored)
    layers = {n: m for n, m in weight_layers(model).items() if n not in skip}
    before = _zeros(layers)
    for module in layers.values():
        prune.l1_unstructured(module, "weight", amount=amount)
        prune.remove(module, "weight")
    total = sum(m.weight.numel() for m in weight_layers(model).values())
    zeroed = (_zeros(layers) - before) / total if total else 0.0
    return Pruned(None, zeroed, sorted(skip), [])


def _zeros(layers: dict[str, Any]) -> int:
    return sum(int((m.weight == 0).sum()) for m in layers.values())


def prune_structured(model: Any, amount: float, inputs: tuple, ignored: Iterable[str],
                     round_to: int | None = None) -> tuple[Any, Pruned]:
    """Remove whole channels from a deep copy of ``model`` (returned with what was done) so
    that ``amount`` of its Conv/Linear weights go, channels kept consistent across residual
    adds, concats and depthwise convs by torch-pruning's dependency graph; the layers that
    produce the model's outputs keep their output channels. ``model`` itself is not touched
    (each trial prunes a fresh copy of it).

    The channel ratio is searched: the first trial is 1 - sqrt(1 - amount) (every layer
    pruned in both dimensions); the next comes from the last trial's per-layer exponents
    (``_solve_ratio``), or, once trials lie on both sides of ``amount``, from the straight
    line between the nearest two (channel counts move in steps, most of all with
    ``round_to``); at most MAX_TRIALS, the closest kept."""
    outs = output_layers(model, inputs)
    skip = sorted(set(ignored) | set(outs))
    sizes = {n: m.weight.numel() for n, m in weight_layers(model).items()}
    ratio = 1.0 - math.sqrt(1.0 - amount)
    trials: list[tuple[float, float, Any]] = []  # (ratio, removed, pruned copy)
    for _ in range(MAX_TRIALS):
        pruned = _pruned_copy(model, inputs, ratio, skip, round_to)
        trials.append((ratio, _removed(sizes, pruned), pruned))
        if abs(trials[-1][1] - amount) <= RATIO_TOLERANCE:
            break
        ratio = _next_ratio(trials, sizes, amount)
        if ratio is None or any(abs(ratio - r) < 1e-3 for r, _, _ in trials):
            break
    ratio, removed, pruned = min(trials, key=lambda t: abs(t[1] - amount))
    return pruned, Pruned(ratio, removed, sorted(set(ignored)), outs)


def _next_ratio(trials: list[tuple[float, float, Any]], sizes: dict[str, int],
                amount: float) -> float | None:
    """The next channel ratio to try: between the nearest trials below and above
    ``amount`` when there are both, else solved from the last trial's exponents."""
    below = [t for t in trials if t[1] < amount]
    above = [t for t in trials if t[1] > amount]
    if below and above:
        (r0, f0, _), (r1, f1, _) = max(below, key=lambda t: t[1]), min(above,
                                                                        key=lambda t: t[1])
        return r0 + (amount - f0) * (r1 - r0) / (f1 - f0) if f1 > f0 else None
    ratio, _, probe = trials[-1]
    return _solve_ratio(sizes, probe, ratio, amount)


def _pruned_copy(model: Any, inputs: tuple, ratio: float, skip: list[str],
                 round_to: int | None) -> Any:
    """A deep copy of ``model`` with ``ratio`` of every prunable group's channels removed by
    torch-pruning's BasePruner (MetaPruner's current name) with L1 magnitude importance."""
    import torch_pruning as tp

    work = copy.deepcopy(model)
    names = dict(work.named_modules())
    pruner = tp.pruner.BasePruner(
        work, inputs, importance=tp.importance.MagnitudeImportance(p=1),
        pruning_ratio=ratio, ignored_layers=[names[n] for n in skip], round_to=round_to,
        forward_fn=lambda m, x: m(*x))
    pruner.step()
    return work


def _removed(sizes: dict[str, int], pruned: Any) -> float:
    """The fraction of the original Conv/Linear weight elements no longer in ``pruned``."""
    after = {n: m.weight.numel() for n, m in weight_layers(pruned).items()}
    total = sum(sizes.values())
    return 1.0 - sum(after.get(n, 0) for n in sizes) / total if total else 0.0


def _solve_ratio(sizes: dict[str, int], probe: Any, ratio: float,
                 amount: float) -> float | None:
    """The channel ratio that removes ``amount`` of the weights, from one probe at ``ratio``.

    Each layer kept k = (1 - ratio)^e of its weights in the probe: e is how many of its
    dimensions the groups pruned (0, 1 or 2; fractional where channel counts rounded). With
    those exponents the removed fraction at any ratio r is 1 - sum(n (1 - r)^e) / sum(n),
    which rises with r; bisection finds the r that gives ``amount``."""
    after = {n: m.weight.numel() for n, m in weight_layers(probe).items()}
    base = math.log(1.0 - ratio) if 0 < ratio < 1 else 0.0
    if base == 0.0:
        return None
    exps = {n: math.log(max(after.get(n, 1), 1) / size) / base for n, size in sizes.items()}
    total = sum(sizes.values())

    def removed(r: float) -> float:
        return 1.0 - sum(s * (1.0 - r) ** exps[n] for n, s in sizes.items()) / total

    lo, hi = 0.0, 0.95
    if removed(hi) < amount:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if removed(mid) < amount else (lo, mid)
    return (lo + hi) / 2
