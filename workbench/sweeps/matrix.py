"""The sweep matrix: which choices to cross, each checked, and the cells they make."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..runtime.arm_env import TARGETS

# Each axis: its allowed values (None: any int in a range) and its default.
AXES: dict[str, tuple[tuple[Any, ...] | None, Any]] = {
    "exporter": (("torchscript", "dynamo"), "torchscript"),
    "opset": (None, None),  # None: the exporter's own default
    "simplify": (("onnxslim", "onnxsim", "onnxscript", "none"), "onnxslim"),
    "raise": ((True, False), True),
    # the weights pnnx writes; fp16-storage also runs ncnn with fp16 storage (fp32 arithmetic),
    # and on an ARM target every value is also the precision ncnn runs there (RUN_PRECISION)
    "ncnn": (("fp32", "fp16", "fp16-storage", "none"), "fp32"),
    # int8 through wb.quantize on every backend the cell has, or on one
    "precision": (("fp32", "int8", "int8-onnxruntime", "int8-ncnn"), "fp32"),
    # where the ncnn candidates run: None, this machine's ncnn; an ARM target, ncnn's own
    # aarch64 build under QEMU user mode (workbench.runtime.arm_env.TARGETS)
    "target": ((None, *TARGETS), None),
}
# Axes that stay out of a cell's choices (its id and label) at their default: a sweep that does
# not cross them is the same sweep, with the same cell ids, as before they existed (resume).
IMPLICIT = {"precision", "target"}
FP16_WEIGHTS = ("fp16", "fp16-storage")  # ncnn values that write fp16 weights


def run_precision(ncnn: str, target: str | None) -> str:
    """The precision ncnn runs a cell's ncnn model in (``NcnnRunner(precision=)``): on an ARM
    target, the ``ncnn`` value itself (fp16: fp16 storage, and fp16 arithmetic where the CPU
    has it, as a phone runs ncnn by default); on this machine fp32, except fp16-storage (fp16
    weights alone are read into fp32: what the sweep has always compared)."""
    if target is not None or ncnn == "fp16-storage":
        return ncnn
    return "fp32"
_ALIASES = {"precision": {"int8-ort": "int8-onnxruntime", "ort": "int8-onnxruntime",
                          "ncnn-int8": "int8-ncnn", "ort-int8": "int8-onnxruntime",
                          "float": "fp32", "none": "fp32"}}
OPSETS = range(7, 26)
_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}


@dataclass(frozen=True)
class Cell:
    """One model under one combination of choices; ``id`` is stable across runs."""

    model: str  # the factory spec
    name: str  # the short model name shown in tables
    choices: tuple[tuple[str, Any], ...]

    @property
    def options(self) -> dict[str, Any]:
        """Every axis's value: the implicit ones left out of ``choices`` at their default."""
        return {k: AXES[k][1] for k in IMPLICIT} | dict(self.choices)

    @property
    def label(self) -> str:
        """'torchscript opset=- onnxslim raise ncnn fp32'-like: the choices in one line."""
        return " ".join(f"{k}={show(v, k)}" for k, v in self.choices)

    @property
    def id(self) -> str:
        text = json.dumps([self.model, list(self.choices)], sort_keys=True)
        return f"{_slug(self.name)}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


@dataclass
class Matrix:
    """Choices to cross: {axis: [values]}; axes left out take their default value."""

    axes: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Matrix | dict[str, Any] | None) -> Matrix:
        """Check ``spec`` ({axis: value or list of values}) and return it with defaults filled."""
        if isinstance(spec, Matrix):
            return spec
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise InputError(f"matrix: expected a dict {{choice: [values]}}, got "
                             f"{type(spec).__name__}",
                             "e.g. {'exporter': ['torchscript', 'dynamo'], 'ncnn': ['fp32', "
                             "'fp16']}")
        axes: dict[str, list[Any]] = {}
        for key, values in spec.items():
            if key not in AXES:
                raise InputError(f"matrix: unknown choice {key!r}; known: {', '.join(AXES)}",
                                 _example(None))
            vals = values if isinstance(values, (list, tuple)) else [values]
            if not vals:
                raise InputError(f"matrix[{key!r}] is empty", _example(key))
            axes[key] = _dedupe([_value(key, v) for v in vals])
        for key, (_, default) in AXES.items():
            if key in IMPLICIT and axes.get(key, [default]) == [default]:
                axes.pop(key, None)  # not crossed: out of the ids, labels and stored matrix
            else:
                axes.setdefault(key, [default])
        return cls({k: axes[k] for k in AXES if k in axes})

    def cells(self, models: list[str], names: list[str]) -> list[Cell]:
        """Every model crossed with every combination, models outermost."""
        keys = list(self.axes)
        return [Cell(spec, name, tuple(zip(keys, combo, strict=True)))
                for spec, name in zip(models, names, strict=True)
                for combo in itertools.product(*(self.axes[k] for k in keys))]

    def to_json(self) -> str:
        return json.dumps(self.axes, sort_keys=True)


def show(v: Any, key: str | None = None) -> str:
    """A choice as a label shows it: on/off, 'default' for the exporter's own opset, 'host'
    for the target of this machine."""
    if v is None and key == "target":
        return "host"
    return "on" if v is True else "off" if v is False else "default" if v is None else str(v)


def _value(key: str, v: Any) -> Any:
    allowed, _ = AXES[key]
    if key == "opset":
        if v is None or (isinstance(v, str) and v.lower() in ("default", "none", "-")):
            return None
        try:
            n = int(v)
        except (TypeError, ValueError):
            n = -1
        if isinstance(v, bool) or n not in OPSETS:
            raise InputError(f"matrix['opset']: {v!r} is not an opset from {OPSETS.start} to "
                             f"{OPSETS.stop - 1}", _example(key))
        return n
    if key == "target":
        return _target(v)
    if key == "raise" and isinstance(v, str) and v.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[v.lower()]
    if isinstance(v, str):
        v = v.lower()
        v = _ALIASES.get(key, {}).get(v, v)
    if key == "precision" and v in ("fp16", "bf16"):
        raise InputError(f"matrix['precision']: {v!r} is not a quantization the sweep runs",
                         "ncnn fp16 is its own choice: {'ncnn': ['fp32', 'fp16']}; precision "
                         "crosses fp32 with int8 (wb.quantize): {'precision': ['fp32', "
                         "'int8']}")
    if v is None and key == "simplify":
        return "none"
    if allowed is not None and (v not in allowed or (key != "raise" and isinstance(v, bool))):
        shown = ", ".join("on" if a is True else "off" if a is False else str(a) for a in allowed)
        raise InputError(f"matrix[{key!r}]: unknown value {v!r}; expected one of {shown}",
                         _example(key))
    return v


def _target(v: Any) -> str | None:
    """A target value: None (or none/host/x86) for this machine, else a known ARM target's
    name (its environment is checked where the cells run, not here: a Dask worker may have it
    where this machine does not)."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("none", "host", "x86",
                                                                  "native", "")):
        return None
    if not isinstance(v, str) or v.strip() not in TARGETS:
        known = "; ".join(f"{t.name}: {t.stands_for}" for t in TARGETS.values())
        raise InputError(f"matrix['target']: unknown ARM target {v!r}; expected None (this "
                         f"machine) or one of {', '.join(TARGETS)}",
                         f"{_example('target')}. The targets: {known}")
    return v.strip()


def _example(key: str | None) -> str:
    examples = {"exporter": "'exporter': ['torchscript', 'dynamo']", "opset": "'opset': [13, 17]",
                "simplify": "'simplify': ['onnxslim', 'none']", "raise": "'raise': [True, False]",
                "ncnn": "'ncnn': ['fp32', 'fp16']",
                "target": "'target': [None, 'arm64-v8.2']",
                "precision": "'precision': ['fp32', 'int8'] (or 'int8-onnxruntime', "
                             "'int8-ncnn': one backend)"}
    if key is None:
        return "e.g. {" + ", ".join(examples.values()) + "}"
    return f"e.g. {{{examples[key]}}}"


def _dedupe(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:40] or "model"
