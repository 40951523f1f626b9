"""TorchRunner: the reference, an ``nn.Module`` run in eval mode without grad.

``capture="all"`` records, in one forward pass, every leaf module's output under its
qualified name (``layer1.0.conv1``) and the tensor results of functional calls made outside
leaf modules, named by the module that made them and the function (``F.interpolate_0`` at
the top level, ``layer1.0/Tensor.__add___0`` inside a block). A leaf called more than once (one ``self.relu``
after two convolutions) gives one record per call: ``relu``, ``relu#1``, ... Hooks plus a TorchFunctionMode,
as torch.fx's Interpreter would see the same calls, but without tracing.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections import Counter
from typing import Any

from ..errors import InputError, WorkbenchError
from ..inputs import as_tensor_tuple, flatten_outputs, rejected
from .base import ModelIO, Runner, TensorSpec
from .heap import keep_freed_memory
from .memory import allocation_failure, check_fits, too_large

_PREFIXES = (("torch.nn.functional.", "F."), ("torch.Tensor.", "Tensor."), ("torch._C._nn.", "F."),
             ("torch._C._VariableFunctions.", "torch."))


def _short(func: Any) -> str:
    import torch

    name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "op")
    for long, short in _PREFIXES:
        if name.startswith(long):
            return short + name[len(long):]
    return name


class TorchRunner(Runner):
    name = "torch"

    def __init__(self, model: Any, output_names: list[str] | None = None) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InputError(f"TorchRunner needs an nn.Module, got {type(model).__name__}",
                             "pass the model object itself, e.g. TorchRunner(MyNet())")
        self.model = model
        self.output_names_given = output_names
        self._pool: dict[str, Any] = {}  # capture="all" buffers, reused when free

    def describe(self) -> ModelIO:
        return ModelIO(inputs=tuple(TensorSpec(n) for n in self.input_names))

    @property
    def input_names(self) -> list[str]:
        import inspect

        params = inspect.signature(self.model.forward).parameters.values()
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs as {name: tensor}: a dict by forward()'s parameter names, a tuple in order,
        or one tensor or array; an unknown name is an InputError naming forward()'s."""

        names = self.input_names
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(names))
            if unknown or not inputs:
                raise InputError(
                    f"inputs for {type(self.model).__name__}: "
                    + (f"unknown name(s) {unknown}" if unknown else "an empty dict")
                    + f"; forward() takes {names}",
                    "pass a dict keyed by forward()'s parameter names, or a tuple in order")
            inputs = tuple(inputs[n] for n in names if n in inputs)
        tensors = as_tensor_tuple(inputs)
        # forward(*args) names nothing: number the rest
        names += [f"input_{i}" for i in range(len(names), len(tensors))]
        return dict(zip(names, tensors, strict=False))

    def _execute(self, feed: dict[str, Any], capture: str) -> dict[str, Any]:
        import torch

        model = type(self.model).__name__
        # the model's own copy: a forward that writes into its input (x.mul_(2), x += y)
        # must not change the caller's tensor or array, nor the inputs other backends get
        check_fits(feed, model, what="the run copies it, as a forward may write into it")
        args = tuple(t.clone() for t in feed.values())
        was_training = self.model.training
        self.model.eval()
        records: dict[str, Any] = {}
        try:
            with torch.no_grad():
                if capture == "all":
                    out = self._forward_recording(args, records)
                else:
                    out = self.model(*args)
        except Exception as e:  # the model's own error says what it wanted

            if isinstance(e, WorkbenchError):
                raise
            if (tried := allocation_failure(e)) is not None:  # not the inputs' form: size
                raise too_large(feed, model, tried, str(e)) from e
            raise rejected(self.model, args, "inputs", e,
                           "give inputs of the dtype, rank and shape the model's forward() "
                           "expects (the same as the ONNX or ncnn model's inputs: float32, "
                           "batch first)") from e
        finally:
            self.model.train(was_training)
        tensors = flatten_outputs(out)
        names = self.output_names_given or [f"output_{i}" for i in range(len(tensors))]
        records.update({n: t.detach().cpu().numpy() for n, t in zip(names, tensors,
                                                                     strict=False)})
        return records

    def _forward_recording(self, args: tuple, records: dict[str, Any]) -> Any:
        keep_freed_memory()
        rec = self._pass(args, records, copy=False)
        if not rec.intact:  # a held tensor was changed where the mode could not see it
            records.clear()
            rec = self._pass(args, records, copy=True)
        return rec.result

    def _pass(self, args: tuple, records: dict[str, Any], copy: bool) -> _Recorder:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        rec = _Recorder(self.model, records, self._pool, copy)
        # two global hooks rather than two per module: registering and removing ~400
        # handles cost more than the hooks themselves (ResNet-50: ~10 ms a pass)
        handles = [register_module_forward_pre_hook(rec.pre),
                   register_module_forward_hook(rec.post)]
        try:
            with _recording_mode()(rec):
                rec.result = self.model(*args)
        finally:
            for h in handles:
                h.remove()
            rec.resume_mode()  # a leaf that raised left it off
        rec.finish()
        return rec


_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                    "__ilshift__", "__irshift__", "__imatmul__"}
# func -> whether its name says it writes its first argument (asked once per function)
_WRITES_FIRST: dict[Any, bool] = {}
_SHORT: dict[Any, str] = {}  # func -> its short name (resolve_name walks a big table)


def _writes_first(func: Any) -> bool:
    hit = _WRITES_FIRST.get(func)
    if hit is None:
        name = getattr(func, "__name__", "")
        hit = _WRITES_FIRST[func] = ((name.endswith("_") and not name.endswith("__"))
                                     or name in _INPLACE_DUNDERS)
    return hit


def _written(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors a call is about to write: ``x.add_()``, ``x[i] = v``, ``x += y``,
    ``F.relu(x, inplace=True)``, ``out=``. (aten schemas say it exactly, but only below a
    TorchDispatchMode, which would slow every op; what this misses, the version check after
    the pass catches.)"""
    hit = []
    if args and (_writes_first(func) or kwargs.get("inplace") is True):
        hit.append(args[0])
    out = kwargs.get("out")
    if out is not None:
        hit.extend(out if isinstance(out, (tuple, list)) else [out])
    return hit


def _module_names(model: Any) -> tuple[dict[Any, str], dict[Any, str]]:
    """({container: qualified name}, {leaf: qualified name}), as ``named_modules`` names them
    (first name wins for a module registered twice). The model itself is never a leaf: its
    output is output_0, and what it calls is recorded even when it has no submodules.
    (A walk over ``_modules``: named_modules plus a children() test per module took ~1 ms
    a pass on a ResNet-50.)"""
    containers: dict[Any, str] = {model: ""}
    leaves: dict[Any, str] = {}

    def walk(module: Any, prefix: str) -> None:
        for key, child in module._modules.items():
            if child is None or child in containers or child in leaves:
                continue
            name = f"{prefix}.{key}" if prefix else key
            grandchildren = child._modules
            if grandchildren and any(c is not None for c in grandchildren.values()):
                containers[child] = name
                walk(child, name)
            else:
                leaves[child] = name

    walk(model, "")
    return containers, leaves


class _Recorder:
    """State of one capture='all' pass. Kept free of reference cycles, so the tensors of a
    result the caller has dropped are free again (refcount) when the next run starts.

    Tensors are held as they were produced, not copied: copying ~200 activations cost
    ~1.4x the plain run, holding them nothing. A held tensor an in-place op is about to
    overwrite (``ReLU(inplace=True)``, ``x += y``) is copied just before the op. ``finish``
    then checks every held tensor's version counter: a change made where the mode cannot
    see it (inside a C++ op, under DisableTorchFunction) leaves ``intact`` False and the
    runner records again with ``copy=True``: each tensor copied when it is produced, into
    buffers kept from run to run; correct whatever the model does.

    The hooks run for every module call and ``keep`` for every leaf (~280 and ~230 on a
    ResNet-50), so they do the least they can: one dict lookup to tell a leaf from a
    container from another model's module, no per-call allocation beyond the record.
    """

    def __init__(self, model: Any, records: dict[str, Any], pool: dict[str, Any],
                 copy: bool = False) -> None:
        import torch

        self.records, self.pool, self.copy = records, pool, copy
        self.containers, self.leaves = _module_names(model)
        self.stack: list[str] = []  # names of the containers running, innermost last
        self.counts: Counter[tuple[str, str]] = Counter()
        self.calls: dict[str, int] = {}  # leaf name -> calls so far (relu, relu#1, ...)
        # (tensor id, version) -> (weak ref to the tensor, what was kept): the same unchanged
        # tensor seen again (an Identity leaf, a block that returns its input) is the same
        # values, kept once
        self.seen: dict[tuple[int, int], tuple[Any, Any]] = {}
        # storage address -> [(record name, tensor, its version then)]: tensors held
        self.held: dict[int, list[tuple[str, Any, int]]] = {}
        self.held_ids: set[int] = set()  # ids of the held tensors (alive while held)
        self.intact = True
        self.result: Any = None
        self.off: list[Any] = []  # DisableTorchFunction contexts entered by leaves
        self._disable = torch._C.DisableTorchFunction
        self._tensor = torch.Tensor

    def pre(self, module: Any, args: Any) -> None:
        name = self.leaves.get(module)  # the hooks are global: other models' modules pass too
        if name is None:
            name = self.containers.get(module)
            if name is not None:
                self.stack.append(name)
            return
        # inside a leaf the mode has nothing to record: turn it off there (most of the calls
        # a model makes are inside leaves). Off first, so that copies made for a leaf that
        # says it writes its input (ReLU(inplace=True)) do not reach the mode; any other
        # write is caught by the version check after the pass.
        off = self._disable()
        off.__enter__()
        self.off.append(off)
        # (from __dict__: getattr on a module without the attribute goes through
        # Module.__getattr__ and an AttributeError, ~1 us on each of ~230 leaves)
        if self.held and module.__dict__.get("inplace", False) is True:
            self.before_write(args)

    def post(self, module: Any, _args: Any, output: Any) -> None:
        name = self.leaves.get(module)
        if name is None:
            if module in self.containers:
                self.stack.pop()
            return
        if self.off:  # kept while torch functions are still off: our calls are not the model's
            k = self.calls.get(name, 0)
            self.calls[name] = k + 1
            if k:
                name = f"{name}#{k}"
            try:
                if isinstance(output, self._tensor):
                    self._keep_one(name, output)
                else:
                    self.keep(name, output)
            finally:
                self.off.pop().__exit__(None, None, None)

    def resume_mode(self) -> None:
        while self.off:
            self.off.pop().__exit__(None, None, None)

    def call_name(self, func: Any) -> str:
        """The record name of this call of ``func`` in the current scope (``layer1/F.relu_0``),
        counted: the next call of it there gets the next index."""
        scope = self.stack[-1] if self.stack else ""
        short = _SHORT.get(func)
        if short is None:
            short = _SHORT[func] = _short(func)
        k = self.counts[(scope, short)]
        self.counts[(scope, short)] += 1
        return f"{scope}/{short}_{k}" if scope else f"{short}_{k}"

    def functional(self, func: Any, result: Any) -> None:
        name = self.call_name(func)
        with self._disable():  # a tensor subclass's own __torch_function__ is not the model's
            self.keep(name, result)

    def keep(self, name: str, value: Any) -> None:
        if isinstance(value, self._tensor):
            self._keep_one(name, value)
            return
        tensors = flatten_outputs(value)
        if len(tensors) == 1:
            self._keep_one(name, tensors[0])
        else:
            for i, t in enumerate(tensors):
                self._keep_one(f"{name}.{i}", t)

    def _keep_one(self, name: str, t: Any) -> None:
        try:
            version = t._version
        except RuntimeError:  # an inference tensor keeps no version: copy it
            self.records[name] = self._copy(name, t)
            return
        key = (id(t), version)
        hit = self.seen.get(key)
        if hit is not None and hit[0]() is t:
            kept = self.records[name] = hit[1]
            if id(kept) in self.held_ids:  # copied with the first name, if written
                self.held.setdefault(_storage(kept), []).append((name, kept, version))
            return
        if self.copy or not t.is_cpu:
            kept = self._copy(name, t)
        else:
            # shares t's memory and version counter (no grad here: t itself, mostly)
            kept = t.detach() if t.requires_grad else t
            self.held.setdefault(_storage(kept), []).append((name, kept, version))
            self.held_ids.add(id(kept))
        self.records[name] = kept
        self.seen[key] = (weakref.ref(t), kept)  # weak: t's memory stays free

    def _copy(self, name: str, t: Any) -> Any:
        """t's values in a buffer kept from run to run (fresh arrays for ~200 activations
        cost more in page faults than the copy); one the caller still holds is not reused."""
        import numpy as np

        arr = t.detach().cpu().numpy()
        buf = self.pool.get(name)
        # 3 references: the pool, `buf`, getrefcount's argument; more = the caller's
        if (buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype
                or sys.getrefcount(buf) > 3):
            buf = self.pool[name] = np.empty_like(arr)
        np.copyto(buf, arr)
        return buf

    def before_write(self, targets: Any) -> None:
        """An op is about to write ``targets``: held tensors sharing their memory are
        copied first (once each, however many records name them). Called with torch
        functions off (in the mode's handler, or a leaf's pre hook)."""
        for target in targets:
            if not isinstance(target, self._tensor) or not self.held:
                continue
            clones: dict[int, Any] = {}
            for n, t, version in self.held.pop(_storage(target), ()):
                if t._version != version:  # already changed unseen: finish() says so
                    self.intact = False
                    continue
                clone = clones.get(id(t))
                if clone is None:
                    clone = clones[id(t)] = t.clone()
                    self.held_ids.discard(id(t))
                    # seen again unchanged (the op did not write after all, e.g. dropout
                    # in eval mode): the copy is what it is. t was seen under this key.
                    hit = self.seen.get((id(t), version))
                    if hit is not None and hit[1] is t:
                        self.seen[(id(t), version)] = (hit[0], clone)
                self.records[n] = clone

    def finish(self) -> None:
        """Every held tensor unchanged (else ``intact`` is False); records to numpy."""
        for entries in self.held.values():
            for _, t, version in entries:
                if t._version != version:
                    self.intact = False
        self.held.clear()
        self.held_ids.clear()
        self.seen.clear()
        arrays: dict[int, Any] = {}  # one array per tensor, however many records name it
        tensor = self._tensor
        for n, v in self.records.items():
            if isinstance(v, tensor):  # (a copy is already an array)
                a = arrays.get(id(v))
                if a is None:
                    a = arrays[id(v)] = v.numpy()
                self.records[n] = a


def _storage(t: Any) -> int:
    """The address of a tensor's memory; views of one tensor share it."""
    return t.untyped_storage().data_ptr()


@functools.cache
def _recording_mode() -> type:
    """The TorchFunctionMode class (built once: a class per run would be a reference cycle)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class RecordingMode(TorchFunctionMode):
        def __init__(self, recorder: _Recorder) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_function__(self, func, types, args=(), kwargs=None):
            rec = self.recorder
            if kwargs is None:
                kwargs = {}
            if rec.held:
                written = _written(func, args, kwargs)
                if written:
                    rec.before_write(written)
            result = func(*args, **kwargs)
            if not rec.off and (isinstance(result, torch.Tensor) or (
                    isinstance(result, (tuple, list)) and result
                    and all(isinstance(r, torch.Tensor) for r in result))):
                rec.functional(func, result)
            elif (func is setitem and not rec.off and args
                  and isinstance(args[0], torch.Tensor)):
                # x[i] = v returns nothing, but the state it leaves x in is a tensor torch
                # computed (ncnn's CopyTo writes it as a blob): recorded as this call's
                # output, held like any record (copied before a later write changes it)
                rec.functional(func, args[0])
            if (not rec.off and args and func is not setitem and isinstance(
                    args[0], torch.Tensor) and args[0]._base is not None
                    and _writes_first(func)):
                # an in-place op on a view (x[:, 1].clamp_()) writes into the tensor it
                # views: the state it leaves that one in is x[:, 1] = clamp(x[:, 1])'s
                rec.functional(setitem, args[0]._base)
            return result

    setitem = torch.Tensor.__setitem__
    return RecordingMode
