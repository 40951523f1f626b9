"""The reference side, indexed once: records in call order, the module each belongs to, each
leaf module's calls, shapes in the forms rules match them by, and samples of the values."""

from __future__ import annotations

from typing import Any

from ...shapes import squeezed, unbatched
from .names import call_module, tuple_of
from .sampling import Sample, sample, score


class ReferenceIndex:
    """Torch's records (``name -> array``, in execution order) and what alignment asks of
    them, computed once.

    - ``names``: record names in call order; ``position[name]`` their index.
    - ``keys`` / ``squeezed`` / ``flat``: each record's shape without a batch axis, without
      size-1 axes, and as (size, last axis) (a Gemm's 2-D output is a Linear's
      ``[1, H, W, C]`` with axes merged).
    - ``module_of``: the module each record belongs to: a leaf is its own (each of its calls:
      ``relu``, ``relu#1``); ``layer1/Tensor.add_0`` was called by ``layer1``;
      ``F.interpolate_0`` by the model (``""``); ``lstm.1`` is ``lstm``'s.
    - ``calls``: leaf module -> the indices of its calls, in order.
    - ``scopes``: module -> the indices of every record it owns (its calls and the calls
      made inside it), in order.
    - ``alias``: ``output_k`` -> the earlier record it repeats (itself when none does).
    - ``samples``: the samples scored, shared with the caller's dict when given.
    """

    def __init__(self, reference: dict[str, Any], modules: set[str] | None = None,
                 samples: dict[str, Sample] | None = None) -> None:
        import numpy as np

        self.arrays = reference
        self.modules = modules or set()
        self.names = list(reference)
        self.position = {n: j for j, n in enumerate(self.names)}
        shapes = [np.shape(reference[n]) for n in self.names]
        self.keys = [unbatched(s) for s in shapes]
        self.squeezed = [squeezed(s) for s in shapes]
        self.flat = [(np.size(reference[n]), s[-1:])
                     for n, s in zip(self.names, shapes, strict=True)]
        self.module_of = [self._module(n) for n in self.names]
        self.calls: dict[str, list[int]] = {}
        self.scopes: dict[str, list[int]] = {}
        for j, (n, m) in enumerate(zip(self.names, self.module_of, strict=True)):
            if call_module(n) == m:
                self.calls.setdefault(m, []).append(j)
            self.scopes.setdefault(m, []).append(j)
        self.samples = {} if samples is None else samples
        self.alias = self._aliases()

    def _module(self, name: str) -> str:
        m = call_module(name)
        if m in self.modules:
            return m
        return name.split("/")[0] if "/" in name else tuple_of(name, self.modules)

    def _aliases(self) -> dict[str, str]:
        """torch's output_k is some earlier record returned as it was: that record's name."""
        import numpy as np

        alias: dict[str, str] = {}
        for k, n in enumerate(self.names):
            if n.startswith("output_"):
                ref = self.arrays[n]
                same = [m for m in self.names[:k] if not m.startswith("output_")
                        and np.shape(self.arrays[m]) == np.shape(ref)
                        and np.array_equal(self.arrays[m], ref, equal_nan=True)]
                alias[n] = same[-1] if same else n
        return alias

    def __len__(self) -> int:
        return len(self.names)

    def sample(self, j: int) -> Sample:
        """Record j's sample (taken once: a record is scored against many tensors)."""
        name = self.names[j]
        if name not in self.samples:
            self.samples[name] = sample(self.arrays[name])
        return self.samples[name]

    def scored(self, choices: list[int], got: Sample) -> list[tuple[float, int]]:
        """(score, index) of each record in ``choices`` against sample ``got``, best first."""
        return sorted((score(self.sample(j), got), j) for j in choices)

    def is_call(self, name: str) -> bool:
        """The record is a call of a leaf module (``relu``, ``relu#1``)."""
        return call_module(name) in self.calls

    def owner(self, j: int) -> str:
        """The module record j is the output of (a leaf's call) or was made in."""
        name = self.names[j]
        return call_module(name) if call_module(name) in self.calls else self.module_of[j]
