"""Put one tensor's value back into a PyTorch run: what the sensitivity ranking measures with.

A reference record is a leaf module's call (``layer1.0.conv1``, ``relu#1``: a forward hook
returns the value), a functional call made outside leaf modules (``F.relu_2``,
``layer1/Tensor.add_0``: the TorchRunner's own recording mode names the calls, and the named
call returns the value instead of its result), or a model output (``output_0``: replaced
after the run). What cannot be put back says why, so it is listed as unmeasurable rather than
ranked by a guess.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .align import call_module
from .candidates import copies as _copies

_FUNCTIONAL = re.compile(r"^(?:(?P<scope>.*)/)?(?P<short>[^/]+)_(?P<k>\d+)$")


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
            k = int(reference.split("#", 1)[1]) if "#" in reference else 0
            got = _run_with(self.runner, self.modules[target], k, value, args)
            return (got, "") if got is not None else (
                None, f"module {target}'s call {k} returns no single tensor to replace")
        if reference in self.clean:  # a model output: replaced as it leaves the model
            return {**self.plain(args), reference: value}, ""
        if re.search(r"_\d+\.\d+$", reference):
            return None, f"{reference} is one output of a call that returns several tensors"
        if _FUNCTIONAL.match(reference) is None:
            return None, f"{reference} is neither a module call nor a functional call"
        return _run_replacing(self.runner, reference, value, args)


def _run_with(runner: Any, module: Any, call: int, value: Any, args: tuple
              ) -> dict[str, Any] | None:
    """The reference's outputs with ``module``'s ``call``-th output replaced by ``value``
    (None when that call returns no single tensor)."""
    import torch

    seen = {"n": 0, "ok": False}

    def hook(_m: Any, _i: Any, output: Any) -> Any:
        n = seen["n"]
        seen["n"] += 1
        if n != call or not isinstance(output, torch.Tensor):
            return None
        seen["ok"] = True
        return torch.from_numpy(value).to(output.dtype).reshape(output.shape)

    handle = module.register_forward_hook(hook)
    try:
        got = runner.run(_copies(args))
    finally:
        handle.remove()
    return got if seen["ok"] else None


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

    from ..inputs import flatten_outputs

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
