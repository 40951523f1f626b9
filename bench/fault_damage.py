"""The fault ``bench/faults.py`` puts into a candidate: which weight, and how it is damaged.

One weight (Conv/ConvTranspose/Linear ``weight``, LSTM/GRU ``weight_ih_l0``) of a module
picked at evenly spaced depths of the model's weighted modules in execution order
(first ... last; ``--depths``, ``--quick`` one in the middle), Gaussian noise on a quarter of
its values (seeded by model and module: the same values and draws at every strength), put
*into the candidate*, not the torch reference. Two damages (``--damage``):

- ``relative`` (the bench's since issue 16): each chosen value times 1 + 0.1·K·N(0, 1), noise
  of 10% of the value itself;
- ``max`` (issue 36's, on trained weights): each chosen value plus 0.1·K·max|w|·N(0, 1),
  noise of 10% of the weight's largest magnitude: on a heavy-tailed trained weight most
  values move by far more than 10% of themselves.

``--strength K`` (default 1: the damage as above, "the current strength"; ``1,3`` runs both on
the same candidates and clean comparisons) scales the noise. ``--damage auto`` (default) takes
``max`` on the trained set and ``relative`` on the others (``fault_sets.set_damage``).

The same fault put into a torch copy gives the *torch effect*: the change at the module's
first output over compare's default tolerance there (below 1, no comparison could see it).
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass
from typing import Any

NOISE, FRACTION = 0.10, 0.25
# how the noise scales (see the docstring): by the value itself, or by the weight's max |w|
DAMAGES = ("relative", "max")


@dataclass
class Target:
    module: str  # qualified name, as named_modules gives it
    param: str  # the parameter perturbed: "weight", "weight_ih_l0"
    type: str  # the module class
    index: int  # position among the weighted modules, in execution order


def weighted_modules(model: Any, inputs: tuple) -> list[Target]:
    """Leaf modules with a perturbable weight, in the order forward first calls them."""
    import torch
    from torch import nn

    kinds = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
             nn.ConvTranspose3d, nn.Linear, nn.LSTM, nn.GRU, nn.RNN)
    names = {m: n for n, m in model.named_modules()}
    order: list[Any] = []

    def hook(mod: Any, *_: Any) -> None:
        if mod not in order:
            order.append(mod)

    def weighted(m: Any) -> bool:  # transformers' Conv1D (GPT-2) is a Linear by another name
        return isinstance(m, kinds) or type(m).__name__ == "Conv1D" and hasattr(m, "nf")

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if weighted(m)]
    try:
        with torch.no_grad():
            model(*[t.clone() for t in inputs])
    finally:
        for h in handles:
            h.remove()
    out = []
    for m in order:
        param = "weight_ih_l0" if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN)) else "weight"
        w = getattr(m, param, None)
        if w is None or w.numel() < 16:
            continue
        out.append(Target(names[m], param, type(m).__name__, len(out)))
    return out


def depth_picks(n: int, depths: int) -> list[int]:
    if depths == 1:
        return [n // 2]
    return sorted({round(k * (n - 1) / (depths - 1)) for k in range(depths)})


@dataclass
class Fault:
    """The damage to one torch weight: ``w[idx] = w[idx] * factors + adds`` (flat indices)."""

    idx: Any
    factors: Any  # float32, 1 where the damage only adds
    adds: Any  # float32, in the torch weight's units; 0 where it only scales


def fault(model_name: str, target: Target, w: Any, damage: str = "relative",
          strength: float = 1.0) -> Fault:
    """The noise on a quarter of the values of ``w`` (numpy): ``relative``, each times
    1 + 0.1·K·N(0, 1); ``max``, each plus 0.1·K·max|w|·N(0, 1). The values picked and the
    draws depend on model and module only, not on damage or strength K."""
    import numpy as np

    size = int(w.size)
    rng = np.random.default_rng(zlib.crc32(f"{model_name}/{target.module}".encode()))
    idx = np.sort(rng.choice(size, max(1, int(size * FRACTION)), replace=False))
    noise = NOISE * strength * rng.standard_normal(idx.size)
    if damage == "relative":
        return Fault(idx, (1.0 + noise).astype(np.float32), np.zeros(idx.size, np.float32))
    if damage == "max":
        scale = float(np.abs(w).max())
        return Fault(idx, np.ones(idx.size, np.float32), (noise * scale).astype(np.float32))
    raise ValueError(f"unknown damage {damage!r}; known: {', '.join(DAMAGES)}")


def torch_effect(model: Any, inputs: tuple, target: Target, f: Fault) -> float:
    """The same fault put into a torch copy: max change at the module's first output over
    compare's default tolerance there (below 1, no comparison could see it)."""
    import torch

    from workbench.comparison.metrics import DEFAULT_ATOL, DEFAULT_RTOL

    def first_output(m: Any) -> Any:
        got: list[Any] = []
        mod = dict(m.named_modules())[target.module]
        h = mod.register_forward_hook(lambda _m, _a, out: got.append(
            out[0] if isinstance(out, tuple) else out) if not got else None)
        try:
            with torch.no_grad():
                m(*[t.clone() for t in inputs])
        finally:
            h.remove()
        return got[0].detach().float()

    clean = first_output(model)
    bad = copy.deepcopy(model)
    with torch.no_grad():
        w = getattr(dict(bad.named_modules())[target.module], target.param)
        flat = w.data.reshape(-1)
        at = torch.as_tensor(f.idx)
        flat[at] = flat[at] * torch.as_tensor(f.factors) + torch.as_tensor(f.adds)
    out = first_output(bad)
    tol = DEFAULT_ATOL + DEFAULT_RTOL * float(clean.abs().max())
    return float((out - clean).abs().max()) / tol

