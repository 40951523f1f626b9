"""What a partition returns: its parts, each with its boundary tensors, its torch span and
one artifact per backend that took it, and the chain that runs them in order.

A part a backend could not take (the exporter or pnnx refused it, its numbers were off, or
``keep_in_torch`` asked for it) runs in torch in that backend's chain, and says why. A
boundary tensor whose cut name no backend takes as it is (``nn.Sequential``'s ``"1"``) has
another name in the artifacts, and ``Part.names`` maps it back: TorchScript's exporter
refuses a value named by digits only ("Invalid name: '1'"), ONNX names are identifiers by
the standard, an ncnn blob name is a whitespace-free word of the ``.param`` text. So a
boundary tensor keeps its name in the artifacts only when it is an identifier (letters,
digits, ``_`` and ``.``, not starting with a digit, at most ``MAX_LEN`` characters) that no
other boundary of the model takes (the model's own input and output names included); any
other is written ``cut_<name>`` (other characters as ``_``, a number added while taken).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..artifact.record import Artifact
from ..errors import InputError

ARTIFACT_BACKENDS = ("onnxruntime", "ncnn")
MAX_LEN = 120
PREFIX = "cut_"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def valid_boundary_name(name: str) -> bool:
    """True when ``name`` is taken as it is by TorchScript's and the dynamo exporter, ONNX
    and ncnn: an identifier (``.`` allowed) of at most MAX_LEN characters."""
    return len(name) <= MAX_LEN and _IDENTIFIER.fullmatch(name) is not None


def boundary_names(tensors: list[str], reserved: list[str]) -> dict[str, str]:
    """{tensor name at a cut: the name the parts' artifacts give it} for ``tensors`` (every
    cut's tensors, in order); ``reserved`` are the model's own input and output names, which
    no boundary may take. Valid, unclaimed names map to themselves."""
    taken = set(reserved)
    out: dict[str, str] = {}
    for name in tensors:
        if valid_boundary_name(name) and name not in taken:
            out[name] = name
            taken.add(name)
    for name in tensors:
        if name in out:
            continue
        base = PREFIX + re.sub(r"[^A-Za-z0-9_.]", "_", name)[:MAX_LEN - len(PREFIX) - 4]
        new, k = base, 1
        while new in taken:
            k += 1
            new = f"{base}_{k}"
        out[name] = new
        taken.add(new)
    return out


def shown(name: str, given: dict[str, str]) -> str:
    """A boundary name as a summary shows it: ``cut_1 (cut '1')`` when it was renamed."""
    return f"{name} (cut {given[name]!r})" if name in given else name


@dataclass
class Part:
    """One part: ``inputs``/``outputs`` name its boundary tensors (the ONNX input and output
    names of its artifacts, in order); ``names`` {artifact name: the name at the cut} for
    those written otherwise than the cut names them (``cut_1`` for a cut at ``"1"``);
    ``torch`` is its span as an ``nn.Module`` (None for a part cut from an ONNX model);
    ``artifacts`` {backend: Artifact} holds what each backend took, ``in_torch`` {backend:
    reason} what it did not; ``example`` its inputs on the example and ``reference`` its
    outputs there (numpy)."""

    index: int
    inputs: list[str]
    outputs: list[str]
    torch: Any = field(default=None, repr=False)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    in_torch: dict[str, str] = field(default_factory=dict)
    example: tuple = field(default=(), repr=False)
    reference: list = field(default_factory=list, repr=False)
    names: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"part{self.index}"

    @property
    def onnx(self) -> Artifact | None:
        """The ONNX artifact for ONNX Runtime (None when the part stays in torch there)."""
        return self.artifacts.get("onnxruntime")

    @property
    def ncnn(self) -> Artifact | None:
        """The ncnn artifact (None when the part stays in torch for ncnn)."""
        return self.artifacts.get("ncnn")

    def runs_on(self, backend: str) -> str:
        """What runs this part in ``backend``'s chain: the backend, or "torch" (or
        "onnxruntime" for a part cut from an ONNX model that the backend did not take)."""
        if backend in self.artifacts:
            return backend
        return "torch" if self.torch is not None or self.onnx is None else "onnxruntime"

    def run(self, inputs: Any, backend: str = "onnxruntime") -> list:
        """This part on ``inputs`` (its input tensors in order, torch or numpy) with
        ``backend``, or its torch span when the backend did not take it; numpy outputs."""
        import numpy as np
        import torch

        from ..runtime import runner_for

        args = tuple(torch.as_tensor(np.asarray(a)) if not isinstance(a, torch.Tensor)
                     else a for a in inputs)
        if backend not in self.artifacts and self.torch is None and self.onnx is not None:
            backend = "onnxruntime"  # cut from an ONNX model: no torch span to fall back on
        if backend in self.artifacts:
            got = runner_for(self.artifacts[backend]).run(args)
            return [np.asarray(v) for v in got.values()][:len(self.outputs)]
        if self.torch is None:
            raise InputError(f"{self.name} has no artifact for {backend!r} and no torch span "
                             "(it was cut from an ONNX model)",
                             f"partition with backends=({backend!r}, 'onnxruntime')")
        with torch.no_grad():
            return [t.detach().cpu().numpy() for t in self.torch(*args)]

    def line(self) -> str:
        ran = ", ".join(f"{b}: {a.id}" for b, a in self.artifacts.items())
        kept = ", ".join(f"{b}: torch ({why})" for b, why in self.in_torch.items())
        ins = ", ".join(shown(n, self.names) for n in self.inputs)
        outs = ", ".join(shown(n, self.names) for n in self.outputs)
        return (f"{self.name}: {ins} -> {outs}"
                f"  [{'; '.join(x for x in (ran, kept) if x)}]")


@dataclass
class Partition:
    """The parts of one model, in order; ``cuts`` are the boundary tensors between them as
    the cuts name them (a part's ``names`` maps the names its artifacts give those a
    backend would not take as they are). ``boundaries(inputs)`` gives the reference values at every cut for model inputs
    (the torch model's, or the whole ONNX model's for a partition of an ONNX model)."""

    parts: list[Part]
    cuts: list[list[str]]
    backends: tuple[str, ...]
    source: str  # "torch" or "onnx"
    _boundaries: Callable[[tuple], list[list]] = field(repr=False, default=None)  # type: ignore[assignment]

    def boundaries(self, inputs: Any) -> list[list]:
        """[the model inputs, the values at cut 0, ..., the model outputs] as numpy, by the
        reference (torch spans, or the whole ONNX model)."""
        from ..inputs import as_tensor_tuple

        return self._boundaries(as_tensor_tuple(inputs))

    def run(self, inputs: Any, backend: str = "onnxruntime") -> list:
        """The chain: each part in ``backend`` (or torch, where it stays there) on what the
        part before it returned; the model's outputs as numpy."""
        from ..inputs import as_tensor_tuple

        values: list = list(as_tensor_tuple(inputs))
        for part in self.parts:
            values = part.run(values, backend)
        return values

    def summary(self) -> str:
        """One line per part: its boundary tensors and where it runs for each backend."""
        return "\n".join(p.line() for p in self.parts)

    def __repr__(self) -> str:
        return f"Partition({len(self.parts)} parts, cuts={self.cuts})"
