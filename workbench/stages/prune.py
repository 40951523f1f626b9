"""Pruning, and what the deployed model feels of it (issue 33, item 3).

``wb.prune(model, 0.5, method="l1-structured", example_inputs=(x,))`` prunes a deep copy of
``model`` and measures it against the unpruned model where it will run: parameters and MACs
in torch, the exported ONNX file and the ncnn .bin, ONNX Runtime and ncnn latency side by
side, and how far the outputs moved. Structured pruning (torch-pruning's dependency graph,
whole channels) shrinks all of it; unstructured (``torch.nn.utils.prune``) zeroes weights
that the dense files still store and the backends still multiply, and the report says so.
"""

from __future__ import annotations

import copy
import difflib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..artifact.workspace import Workspace, as_workspace
from ..errors import InputError
from ..progress import Progress, Steps
from .prune_measure import BACKENDS, measure_backends
from .prune_methods import (
    METHODS,
    flat_tensors,
    prune_structured,
    prune_unstructured,
    weight_layers,
)
from .prune_report import BeforeAfter, PruneReport, PruneResult

_EXAMPLE = "wb.prune(model, 0.5, method='l1-structured', example_inputs=(x,))"


def prune(model: Any, amount: float, method: str = "l1-structured", *,
          example_inputs: Any = None, ignored_layers: Iterable[Any] = (),
          round_to: int | None = 8, backends: Sequence[str] = BACKENDS,
          workspace: Workspace | str | None = None, threads: int = 1, repeat: int = 15,
          warmup: int = 3, export_options: Mapping[str, Any] | None = None,
          progress: Progress = True) -> PruneResult:
    """Prune a copy of ``model`` and measure it against the unpruned model on each backend.

    Args:
        model: the ``torch.nn.Module`` to prune; it is deep-copied first and never changed,
            also when pruning fails.
        amount: the fraction of the Conv/Linear weights to take away, in [0, 1): removed with
            whole channels ("l1-structured": the channel ratio that removes it is found) or
            set to zero ("l1-unstructured": that fraction of each layer's weight).
        method: "l1-structured" (torch-pruning's dependency graph with L1 magnitude
            importance: channels stay consistent across residual adds, concats and
            depthwise convs; the layers producing the outputs keep their width) or
            "l1-unstructured" (``torch.nn.utils.prune.l1_unstructured`` on every Conv and
            Linear weight, made permanent with ``prune.remove`` so the module exports).
        example_inputs: the model's inputs (a tensor or a tuple of them): traced by
            torch-pruning, and the inputs every figure is measured on.
        ignored_layers: layers to leave whole, as modules of ``model`` or their names.
        round_to: structured: keep every pruned width a multiple of this. The default 8
            keeps the packed kernels (ONNX Runtime's NCHWc, ncnn's elempack 4/8): pruned
            50% at exact widths, the zoo's MobileNetV2 ran 2.8x *slower* on ONNX
            Runtime and 1.3x on ncnn (bench/prune_figures.py). Widths move in steps
            then, the amount met as closely as they allow (``report.weights_pruned``);
            None prunes to the exact ratio.
        backends: which of "onnxruntime" and "ncnn" to export, weigh and time; () measures
            torch only (parameters, MACs, output change) and writes nothing.
        workspace: where the four models are written (default: ``./workbench-runs/default``).
        threads: intra-op threads of both backends; with 1 a run's latency is its CPU
            time on the calling thread, with more its wall time (``report.timing``).
        repeat, warmup: timed alternating rounds (``report.timing`` says how they make a
            latency); the fewest untimed runs of each model first, more until it settles.
        export_options: keyword arguments for ``wb.export`` of both models (exporter, opset).
        progress: a tqdm.auto bar over the steps (True), a callback given each ``Step``, or
            nothing (False).

    Returns:
        PruneResult: ``model`` (the pruned module, in ``model``'s training mode) and
        ``report`` (PruneReport: figures before and after, ratios, notes; ``summary()``,
        ``table()``, HTML in a notebook).

    Raises:
        InputError: ``amount`` outside [0, 1), an unknown ``method`` (the close name
            suggested), no ``example_inputs``, ``ignored_layers`` that are not in ``model``,
            a bad backend, or a model torch-pruning cannot trace or prune consistently.

    Example: ``res = wb.prune(model, 0.5, example_inputs=(x,)); res.report.ncnn_ms.ratio``
    """
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    amount, method, backends = (_check_amount(amount), _check_method(method),
                                _check_backends(backends))
    inputs = _check_inputs(model, example_inputs)
    _check_counts(threads=threads, repeat=repeat, warmup=warmup, round_to=round_to)
    base = _copy(model).eval()  # no BatchNorm statistics move while tracing
    _check_runs(base, inputs)
    ignored = _ignored_names(base, model, ignored_layers)
    ws = as_workspace(workspace) if backends else None
    total = 2 + (2 + 2 * ("ncnn" in backends) + 1 if backends else 0)
    with Steps(progress, "prune", total) as steps:
        steps.phase(f"{method} {amount:.0%}")
        pruned, info = _prune(base, amount, method, inputs, ignored, round_to)
        steps.advance()
        steps.phase("counting parameters and MACs")
        report = _torch_figures(base, pruned, inputs, method, amount, info)
        steps.advance()
        if backends:
            measured = measure_backends(
                base, pruned, inputs, backends, ws, threads=threads, repeat=repeat,
                warmup=warmup, export_options=export_options or {}, step=_stepper(steps))
            _fill(report, measured)
            steps.advance()
    report.round_to = round_to if method == "l1-structured" else None
    report.threads, report.repeat = threads, repeat if backends else 0
    report.load, report.seconds = (load0, os.getloadavg()[0]), time.perf_counter() - t0
    pruned.train(model.training)
    return PruneResult(pruned, report)


def _fill(report: PruneReport, measured: Any) -> None:
    """The backend figures, artifacts, errors and timing into ``report``."""
    for key, fig in measured.figures.items():
        setattr(report, key, fig)
    report.artifacts, report.errors = measured.artifacts, measured.errors
    report.timing = measured.timing


def _stepper(steps: Steps) -> Callable[[str], None]:
    """A ``step(phase)`` that closes the previous step and names the next."""
    started = [False]

    def step(phase: str) -> None:
        if started[0]:
            steps.advance()
        started[0] = True
        steps.phase(phase)

    return step


def _prune(base: Any, amount: float, method: str, inputs: tuple, ignored: list[str],
           round_to: int | None) -> tuple[Any, Any]:
    """The pruned copy of ``base`` and what was done; a model torch-pruning cannot follow
    (its forward fails under tracing, or the pruned channels no longer meet) is an
    InputError naming ``model``."""
    from .prune_methods import Pruned

    if amount == 0.0:
        return copy.deepcopy(base), Pruned(0.0 if method == "l1-structured" else None, 0.0,
                                           ignored, [])
    if method == "l1-unstructured":
        pruned = copy.deepcopy(base)
        return pruned, prune_unstructured(pruned, amount, ignored)
    try:
        pruned, info = prune_structured(base, amount, inputs, ignored, round_to)
    except Exception as err:  # noqa: BLE001 - torch-pruning raises anything while tracing
        raise InputError(
            f"model ({type(base).__name__}) could not be traced by torch-pruning: "
            f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}",
            "torch-pruning follows autograd from a forward on example_inputs: the forward "
            "must run on them with gradients on (no torch.no_grad, .detach() or .data "
            "between layers); a layer it cannot follow can be left whole with "
            "ignored_layers=[...], or use method='l1-unstructured'") from err
    _check_pruned(base, pruned, inputs)
    return pruned, info


def _check_pruned(base: Any, pruned: Any, inputs: tuple) -> None:
    """The pruned model runs on the example inputs and returns the unpruned model's shapes."""
    import torch

    with torch.no_grad():
        want = [tuple(t.shape) for t in flat_tensors(base.eval()(*inputs))]
        try:
            got = [tuple(t.shape) for t in flat_tensors(pruned.eval()(*inputs))]
        except Exception as err:  # noqa: BLE001 - a shape error from any op
            raise InputError(
                f"model ({type(base).__name__}): torch-pruning could not keep its channels "
                f"consistent; the pruned copy fails: {type(err).__name__}: "
                f"{str(err).splitlines()[0][:300] if str(err) else ''}",
                "a tensor the dependency graph cannot follow links two layers (a .detach(), "
                ".data, a no_grad block, a view through Python numbers): leave those layers "
                "whole with ignored_layers=[...], or use method='l1-unstructured'") from err
    if got != want:
        raise InputError(
            f"model ({type(base).__name__}): pruning changed the output shapes {want} -> {got}",
            "a layer producing an output was pruned: pass it in ignored_layers=[...]")


def _torch_figures(base: Any, pruned: Any, inputs: tuple, method: str, amount: float,
                   info: Any) -> PruneReport:
    """The report's torch side: parameters and MACs (torch-pruning's counter) and the output
    change on the example inputs, worst output by SNR."""
    import numpy as np
    import torch
    import torch_pruning as tp

    from ..precision.snr import snr_db

    macs0, params0 = tp.utils.count_ops_and_params(base, inputs)
    macs1, params1 = tp.utils.count_ops_and_params(pruned, inputs)
    with torch.no_grad():
        ref = [t.detach().float().numpy() for t in flat_tensors(base.eval()(*inputs))]
        got = [t.detach().float().numpy() for t in flat_tensors(pruned.eval()(*inputs))]
    snr = min((snr_db(r, g) for r, g in zip(ref, got, strict=True)), default=float("inf"))
    worst = max((float(np.max(np.abs(r.astype(np.float64) - g.reshape(r.shape))))
                 for r, g in zip(ref, got, strict=True) if r.size), default=0.0)
    return PruneReport(method, amount, info.weights_pruned, info.channel_ratio,
                       BeforeAfter(float(params0), float(params1)),
                       BeforeAfter(float(macs0), float(macs1)), snr, worst,
                       ignored=info.ignored, output_layers=info.output_layers)


def _check_amount(amount: Any) -> float:
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not (
            0.0 <= float(amount) < 1.0):
        raise InputError(f"amount={amount!r} is outside [0, 1): it is the fraction of the "
                         "conv/linear weights to take away",
                         f"e.g. 0.3 or 0.5 (1.0 would remove every weight): {_EXAMPLE}")
    return float(amount)


def _check_method(method: Any) -> str:
    if method in METHODS:
        return method
    close = difflib.get_close_matches(str(method), METHODS, n=1, cutoff=0.4)
    raise InputError(f"method={method!r} is not a pruning method; known: {', '.join(METHODS)}",
                     f"did you mean method={close[0]!r}?" if close else
                     "method='l1-structured' removes channels; 'l1-unstructured' zeroes "
                     "weights")


def _check_counts(**counts: Any) -> None:
    for name, value in counts.items():
        least = 0 if name == "warmup" else 1
        if name == "round_to" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InputError(f"{name}={value!r} is not an integer >= {least}",
                             "e.g. threads=1, repeat=15, warmup=3, round_to=None or 8")


def _check_backends(backends: Any) -> tuple[str, ...]:
    given = (backends,) if isinstance(backends, str) else tuple(backends or ())
    for b in given:
        if b not in BACKENDS:
            close = difflib.get_close_matches(str(b), BACKENDS, n=1, cutoff=0.4)
            raise InputError(f"backends: {b!r} is not a backend; known: {', '.join(BACKENDS)}",
                             f"did you mean {close[0]!r}?" if close else
                             "backends=('onnxruntime', 'ncnn'), or () for torch only")
    return given


def _check_inputs(model: Any, example_inputs: Any) -> tuple:
    """``model`` is an nn.Module with a weight layer, ``example_inputs`` a tuple of tensors."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model is a {type(model).__name__}, not a torch.nn.Module",
                         f"pass the PyTorch model: {_EXAMPLE}")
    if not weight_layers(model):
        raise InputError(f"model ({type(model).__name__}) has no Conv or Linear layer to "
                         "prune", "pruning takes away conv/linear weights")
    if example_inputs is None:
        raise InputError("example_inputs is missing: pruning traces the model on them and "
                         "measures every figure on them", _EXAMPLE)
    inputs = (example_inputs if isinstance(example_inputs, (tuple, list))
              else (example_inputs,))
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise InputError("example_inputs must be a tensor or a tuple of tensors, got "
                         f"{[type(t).__name__ for t in inputs]}", _EXAMPLE)
    return tuple(inputs)


def _check_runs(base: Any, inputs: tuple) -> None:
    """The model's forward runs on the example inputs (else nothing can be traced)."""
    import torch

    try:
        with torch.no_grad():
            base(*inputs)
    except Exception as err:  # noqa: BLE001 - whatever the forward raises
        raise InputError(
            f"model ({type(base).__name__}) fails on example_inputs "
            f"{[tuple(t.shape) for t in inputs]}: {type(err).__name__}: "
            f"{str(err).splitlines()[0][:300] if str(err) else ''}",
            f"pass the inputs the model's forward takes, in order: {_EXAMPLE}") from err


def _copy(model: Any) -> Any:
    try:
        return copy.deepcopy(model)
    except Exception as err:  # noqa: BLE001 - whatever the module holds that cannot copy
        raise InputError(f"model ({type(model).__name__}) cannot be deep-copied: {err}",
                         "pruning works on a copy so the model given is never changed; "
                         "move what cannot be copied (open files, locks) out of the "
                         "module") from err


def _ignored_names(base: Any, model: Any, ignored_layers: Iterable[Any]) -> list[str]:
    """Names in ``base`` (the copy) of ``ignored_layers``, given as modules of ``model`` or
    as names; anything else is an InputError naming it."""
    import torch

    single = isinstance(ignored_layers, (str, torch.nn.Module)) or not isinstance(
        ignored_layers, Iterable)  # a Sequential is iterable but means itself
    given = [ignored_layers] if single else list(ignored_layers)
    by_id = {id(m): n for n, m in model.named_modules()}
    names = dict(base.named_modules())
    out = []
    for item in given:
        name = item if isinstance(item, str) else by_id.get(id(item))
        if name is None or name not in names or name == "":
            shown = repr(item) if isinstance(item, str) else type(item).__name__
            close = difflib.get_close_matches(str(item), [n for n in names if n], n=3)
            raise InputError(
                f"ignored_layers: {shown} is not a layer of model ({type(model).__name__})",
                (f"did you mean {', '.join(map(repr, close))}? " if close else "")
                + "pass submodules of the model given (model.fc) or their names from "
                "model.named_modules()")
        out.append(name)
    return sorted(set(out))
