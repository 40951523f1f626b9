"""TorchRunner: the reference, an ``nn.Module`` run in eval mode without grad."""

from __future__ import annotations

from typing import Any

from ..inputs import as_tensor_tuple, flatten_outputs
from .base import Runner


class TorchRunner(Runner):
    name = "torch"

    def __init__(self, model: Any, output_names: list[str] | None = None) -> None:
        import torch

        from ..errors import InputError

        if not isinstance(model, torch.nn.Module):
            raise InputError(f"TorchRunner needs an nn.Module, got {type(model).__name__}",
                             "pass the model object itself, e.g. TorchRunner(MyNet())")
        self.model = model
        self.output_names = output_names

    def describe(self) -> dict[str, Any]:
        return {"inputs": [{"name": n} for n in self.input_names], "outputs": []}

    @property
    def input_names(self) -> list[str]:
        import inspect

        params = inspect.signature(self.model.forward).parameters.values()
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def run(self, inputs: Any, capture: str = "outputs") -> dict[str, Any]:
        import torch

        self._check_capture(capture)
        if capture == "all":
            from ..errors import InputError

            raise InputError("TorchRunner capture='all' arrives with the ncnn/runtimes issue",
                             "use capture='outputs' for now")
        if isinstance(inputs, dict):
            inputs = tuple(inputs[n] for n in self.input_names if n in inputs)
        args = as_tensor_tuple(inputs)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = flatten_outputs(self.model(*args))
        finally:
            self.model.train(was_training)
        names = self.output_names or [f"output_{i}" for i in range(len(out))]
        return {n: t.detach().cpu().numpy() for n, t in zip(names, out, strict=False)}
