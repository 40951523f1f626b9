"""export()'s arguments checked before anything runs: the example inputs against forward()'s
parameters, the input and output names (defaults: ``input``/``output``, or ``input_0``...),
and ``dynamic_axes`` normalised to {name: {axis: "dim name"}}; each refusal an InputError
naming the argument, what was expected and what came."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import InputError
from ..inputs import describe


def check_arity(model: Any, args: tuple) -> None:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= len(args) <= len(positional):
        want = (f"{len(required)}" if len(required) == len(positional)
                else f"{len(required)} to {len(positional)}")
        raise InputError(
            f"{type(model).__name__}.forward({', '.join(p.name for p in positional)}) takes "
            f"{want} input(s), got {len(args)} example input(s): "
            f"{', '.join(describe(a) for a in args) or 'none'}",
            "pass a tuple with one tensor per forward() argument, e.g. (x,) for one input")


def io_names(names: Any, n: int, stem: str, arg: str, what: str,
             allow_fewer: bool = False) -> list[str]:
    if names is None:
        return [stem] if n == 1 else [f"{stem}_{i}" for i in range(n)]
    names = list(names)
    if not all(isinstance(x, str) and x for x in names) or len(set(names)) != len(names):
        raise InputError(f"{arg} must be distinct non-empty strings, got {names!r}",
                         f"e.g. {arg}=['{stem}']")
    if len(names) > n or (len(names) < n and not allow_fewer):
        raise InputError(f"{arg} has {len(names)} name(s) {names}, the {what} number {n}",
                         f"give one name per {what[:-1] if what.endswith('s') else what}")
    return names + [f"{stem}_{i}" for i in range(len(names), n)]


def normalize_dynamic_axes(axes: Any, input_names: list[str], output_names: list[str],
                           args: tuple) -> dict[str, dict[int, str]]:
    if not axes:
        return {}
    if not isinstance(axes, dict):
        raise InputError(f"dynamic_axes must be a dict, got {type(axes).__name__}",
                         "e.g. dynamic_axes={'input': {0: 'batch', 2: 'h', 3: 'w'}}")
    ranks = {n: a.dim() for n, a in zip(input_names, args, strict=True)}
    out: dict[str, dict[int, str]] = {}
    for name, spec in axes.items():
        if name not in input_names and name not in output_names:
            raise InputError(
                f"dynamic_axes names {name!r}, which is not an input or output; inputs are "
                f"{input_names}, outputs {output_names}",
                "use the names given in input_names/output_names (defaults: 'input', "
                "'output', or input_0, input_1...)")
        if isinstance(spec, (list, tuple)):
            spec = {int(a): f"{name}_dim{a}" for a in spec}
        if not isinstance(spec, dict):
            raise InputError(f"dynamic_axes[{name!r}] must be a dict {{axis: name}} or a list "
                             f"of axes, got {spec!r}", "e.g. {0: 'batch'}")
        norm = {}
        for axis, dim in spec.items():
            rank = ranks.get(name)
            if not isinstance(axis, int) or (rank is not None and not -rank <= axis < rank):
                raise InputError(f"dynamic_axes[{name!r}] has axis {axis!r}, but {name!r} has "
                                 f"rank {rank}", f"axes of {name!r} are 0..{(rank or 1) - 1}")
            axis = axis % rank if rank is not None else axis
            norm[axis] = str(dim)
        out[name] = dict(sorted(norm.items()))
    return out


