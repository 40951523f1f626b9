"""Put one tensor's value back into a PyTorch run: what the sensitivity ranking measures with.

A reference record is a leaf module's call (``layer1.0.conv1``, ``relu#1``: a forward hook
returns the value), one tensor of a leaf module's tuple output (``lstm.1``, h_n of
``out, (h_n, c_n) = lstm(...)``: the hook rebuilds the output around it), a functional call
made outside leaf modules (``F.relu_2``, ``layer1/Tensor.add_0``: the TorchRunner's own
recording mode names the calls, and the named call returns the value instead of its result),
or a model output (``output_0``: replaced after the run). One tensor of a functional call
that returns several (``Tensor.chunk_0.1``) is not put back yet. What cannot be put back says why, so it is listed as unmeasurable rather than
ranked by a guess.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ..inputs import flatten_outputs
from .align import call_module
from .candidates import copies as _copies

_FUNCTIONAL = re.compile(r"^(?:(?P<scope>.*)/)?(?P<short>[^/]+)_(?P<k>\d+)$")
# one tensor of a module call that returns several (``lstm.1``: the TorchRunner names the
# tensors of a call's output ``<call>.<i>``, i in ``flatten_outputs`` order)
_PART = re.compile(r"^(?P<call>[^/]+)\.(?P<i>\d+)$")


class TorchInjector:
    """Runs of the reference ``runner`` (a TorchRunner) on ``args`` with one record's value
    replaced; ``clean`` holds the plain run's outputs."""

    def __init__(self, runner: Any, args: tuple) -> None:
        self.runner, self.args = runner, args
        self.modules = dict(runner.model.named_modules())
        self.clean = runner.run(_copies(args))
        self._plain: dict[int, dict[str, Any]] = {id(args): self.clean}

    def plain(self, args: tuple) -> dict[str, Any]:
        """The outputs of a run on ``args`` with nothing replaced (kept per args tuple)."""
        if id(args) not in self._plain:
            self._plain[id(args)] = self.runner.run(_copies(args))
        return self._plain[id(args)]

    def run(self, reference: str, value: Any, args: tuple | None = None
            ) -> tuple[dict[str, Any] | None, str]:
        """(the outputs with ``reference``'s value replaced by ``value``, "") or (None, why
        it cannot be put back). ``value`` has the reference tensor's shape."""
        args = self.args if args is None else args
        target = call_module(reference)
        if target and target in self.modules:
            return self._module_run(reference, None, value, args)
        part = _PART.match(reference)
        if part and call_module(part["call"]) in self.modules:  # one of a module's tensors
            return self._module_run(part["call"], int(part["i"]), value, args)
        if reference in self.clean:  # a model output: replaced as it leaves the model
            return {**self.plain(args), reference: value}, ""
        if re.search(r"_\d+\.\d+$", reference):
            return None, f"{reference} is one output of a call that returns several tensors"
        if _FUNCTIONAL.match(reference) is None:
            return None, f"{reference} is neither a module call nor a functional call"
        return _run_replacing(self.runner, reference, value, args)

    def _module_run(self, call: str, index: int | None, value: Any, args: tuple
                    ) -> tuple[dict[str, Any] | None, str]:
        """The outputs with the module call ``call``'s output (``index``: its index-th
        tensor, as the TorchRunner numbers a call's tensors) replaced by ``value``."""
        target = call_module(call)
        k = int(call.split("#", 1)[1]) if "#" in call else 0
        got, why = _run_with(self.runner, self.modules[target], k, value, args, index)
        return (got, "") if got is not None else (None, f"module {target}'s call {k} {why}")


def _run_with(runner: Any, module: Any, call: int, value: Any, args: tuple,
              index: int | None = None) -> tuple[dict[str, Any] | None, str]:
    """(The reference's outputs with ``module``'s ``call``-th output replaced by ``value``,
    "") or (None, why not). ``index``: the output's index-th tensor (``flatten_outputs``
    order, as the TorchRunner numbers them: ``lstm.1`` is h_n of ``out, (h_n, c_n)``) is
    replaced, the rest of the (nested) tuple, list or dict kept; None: the output is one
    tensor (or a container holding one, which the TorchRunner names as the call)."""
    import torch

    seen = {"n": 0, "why": "was never made"}

    def hook(_m: Any, _i: Any, output: Any) -> Any:
        n = seen["n"]
        seen["n"] += 1
        if n != call:
            return None
        count = len(flatten_outputs(output))
        if (count > 1) != (index is not None) or (index or 0) >= count:
            seen["why"] = (f"returns {count} tensors" if index is None else
                           f"returns no tensor {index} (it returns {count})")
            return None

        def swap(t: Any) -> Any:
            return torch.from_numpy(value).to(t.dtype).reshape(t.shape)

        try:
            out = _replaced(output, index or 0, swap)
        except TypeError as e:
            seen["why"] = f"returns a {type(output).__name__} that cannot be rebuilt ({e})"
            return None
        seen["why"] = ""
        return out

    handle = module.register_forward_hook(hook)
    try:
        got = runner.run(_copies(args))
    finally:
        handle.remove()
    return (None, seen["why"]) if seen["why"] else (got, "")


def _replaced(output: Any, index: int, swap: Any) -> Any:
    """``output`` with its ``index``-th tensor (``flatten_outputs`` order) replaced by
    ``swap(tensor)``: tuples, lists, namedtuples and dicts rebuilt around it (TypeError: a
    container that cannot be rebuilt holds it)."""
    import copy

    import torch

    left = [index]

    def walk(o: Any) -> Any:
        if left[0] < 0:
            return o
        if isinstance(o, torch.Tensor):
            left[0] -= 1
            return swap(o) if left[0] < 0 else o
        if isinstance(o, dict):
            items = {k: walk(v) for k, v in o.items()}
            if all(items[k] is o[k] for k in o):
                return o
            new = copy.copy(o)
            new.update(items)
            return new
        if isinstance(o, (tuple, list)):
            items = [walk(v) for v in o]
            if all(x is y for x, y in zip(items, o, strict=True)):
                return o
            return type(o)(*items) if hasattr(o, "_fields") else type(o)(items)
        n = len(flatten_outputs(o))
        if n and left[0] < n:
            raise TypeError("its tensors are held as attributes")
        left[0] -= n
        return o

    return walk(output)


def _run_replacing(runner: Any, name: str, value: Any, args: tuple
                   ) -> tuple[dict[str, Any] | None, str]:
    """The outputs of a run in which the functional call the TorchRunner records as
    ``name`` returns ``value``: the runner's own recorder names the calls (the same scope
    stack, counts and leaf rule as a capture), so the call replaced is the one captured."""
    import torch
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    model = runner.model
    rec = _replacer()(model, name, value)
    feed = runner.feed(_copies(args))
    was_training = model.training
    model.eval()
    handles = [register_module_forward_pre_hook(rec.pre),
               register_module_forward_hook(rec.post)]
    try:
        with torch.no_grad(), _replacing_mode()(rec):
            out = model(*feed.values())
    finally:
        for h in handles:
            h.remove()
        rec.resume_mode()
        model.train(was_training)
    if not rec.done:
        return None, rec.why or f"no call named {name} in the torch run"
    tensors = flatten_outputs(out)
    names = runner.output_names_given or [f"output_{i}" for i in range(len(tensors))]
    return {n: t.detach().cpu().numpy() for n, t in zip(names, tensors, strict=False)}, ""


@functools.cache
def _replacer() -> type:
    """The TorchRunner's recorder, keeping nothing, swapping one named call's result."""
    from ..runtime.torch_runner import _Recorder, _writes_first

    class Replacer(_Recorder):
        def __init__(self, model: Any, name: str, value: Any) -> None:
            super().__init__(model, {}, {}, copy=False)
            self.name, self.value = name, value
            self.done, self.why = False, ""
            self.swap: Any = None

        def keep(self, name: str, value: Any) -> None:  # nothing is recorded
            return None

        def _keep_one(self, name: str, t: Any) -> None:
            return None

        def functional(self, func: Any, result: Any) -> None:
            if self.call_name(func) != self.name or self.done:
                return
            import torch

            if not isinstance(result, torch.Tensor):
                self.why = f"{self.name} returns several tensors"
                return
            with self._disable():
                new = torch.from_numpy(self.value).to(result.dtype).reshape(result.shape)
                if _writes_first(func) or func is torch.Tensor.__setitem__:
                    result.copy_(new)  # an in-place call: the state it leaves is replaced
                else:
                    self.swap = new  # the call returns it (a view's base stays as it is)
            self.done = True

    return Replacer


@functools.cache
def _replacing_mode() -> type:
    """The TorchRunner's recording mode, returning the swapped result of the named call."""
    from ..runtime.torch_runner import _recording_mode

    base = _recording_mode()

    class ReplacingMode(base):  # type: ignore[misc, valid-type]
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            result = super().__torch_function__(func, types, args, kwargs)
            rec = self.recorder
            if rec.swap is not None:
                result, rec.swap = rec.swap, None
            return result

    return ReplacingMode
