"""NcnnRunner: an ncnn model (.ncnn.param + .ncnn.bin) fed and read as pnnx's script does.

ncnn crashes or reads garbage instead of raising on many mismatches (a 1-D array into a conv
net, the wrong channel count, an 8-byte dtype), so every input is checked against what the
conversion declared before native code sees it: its rank, its channels and dtype, from the
``_ncnn.py`` pnnx writes beside the param and the ``.pnnx.param`` shapes (dynamic axes
included). Each input goes to ncnn with the batch axis pnnx chose (``batch_index``; 233 is
"no batch axis", see ``workbench.shapes``), never an assumed axis 0. Outputs come back as the
model's outputs, ``out0 ... outN`` in the order of the torch model's outputs, in the torch
shape by the one rule of ``workbench.shapes`` (a dropped or squeezed size-1 axis); inputs the
graph never reads are not outputs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .. import customops as cops
from .. import shapes
from ..capacity import check_fits as model_fits
from ..customops import missing_ncnn_hint, register_ncnn_layers
from ..diagnostics import Diagnostic
from ..errors import BackendCrashed, InputError, MissingOpError, ModelFileError, NcnnRunError
from ..ncnn_bin import walk_bin
from . import worker_main
from .base import BlobCapture, ModelIO, Runner, TensorSpec, split_inputs, to_numpy
from .memory import check_fits
from .ncnn_arm import check_target
from .ncnn_arm import place as arm_place
from .ncnn_emulate import check_emulate, execute, load_rounded
from .ncnn_failure import bad_mat, explain, explain_crash
from .ncnn_feed import check_input
from .ncnn_flags import NcnnFlags, check_precision, instead, options
from .ncnn_flags import flags as ncnn_flags
from .ncnn_io import INT_DTYPES, declare_shapes, parse_ncnn_py, pnnx_param_for
from .ncnn_masks import HINT as MASK_HINT
from .ncnn_masks import byte_masks, note
from .ncnn_masks import describe as describe_masks
from .ncnn_model import check_model_files, unloadable_layers
from .recorded import check_recorded
from .remote import RemoteHandle
from .worker import NATIVE, worker

WARM = ("ncnn", __name__)  # what a worker imports to run one (worker.warm)


class NcnnRunner(Runner):
    """Runs an ncnn model; ``run`` returns its outputs (out0...outN in the torch model's
    order and shapes), or with ``capture="all"`` those first and then every other blob."""

    name = "ncnn"
    main_thread = True  # in the worker: ncnn was 20-50% slower run from another thread

    def __init__(self, source: Any, precision: str = "fp32", num_threads: int = 2,
                 isolated: bool = True, timeout: float | None = None, check_sizes: bool = True,
                 emulate: str | None = None, target: str | None = None) -> None:
        """An ncnn model (.ncnn.param + .ncnn.bin) in ncnn.

        Args:
            source: the Artifact wb.to_ncnn returned, or a path to the .ncnn.param.
            precision: "fp32" (fp16 storage and arithmetic off), "fp16" (ncnn's defaults:
                fp16 storage, and fp16 arithmetic on a CPU that has it), "fp16-storage"
                (fp16 storage, fp32 arithmetic) or "bf16" (bf16 storage, fp16 off);
                ``self.flags`` says exactly what ran.
            num_threads: ncnn's threads.
            isolated: run in the crash-isolating worker process (a segfault becomes
                BackendCrashed); False runs in this process.
            timeout: seconds one run may take in the worker before it is abandoned and the
                worker replaced (BackendTimeout); default scales with the model's size.
            check_sizes: refuse a spatial or sequence size other than the converted one when
                a layer holds a size from the conversion (``size_baked_layers``: ncnn would
                compute garbage or crash). False feeds it anyway.
            emulate: "arm-fp16" (with precision="fp16") or "bf16" (with precision="bf16"):
                every weight and every blob between layers rounded to that storage, the
                layers run in fp32 here (``ncnn_emulate``: storage only, not fp16
                arithmetic, ARM's kernels or int8; ``self.emulation.diagnostic`` says so).
                None runs ncnn as it is.
            target: None runs this machine's ncnn; an ARM target (``arm_env.TARGETS``:
                "arm64-v8.2", "arm64-v8.0", "arm64-v8.6") runs ncnn's own aarch64 build in
                a worker under QEMU user mode (``ncnn_arm``; set up by ``make
                arm-target``), always isolated: never a fall back to this machine.
        """
        check_precision(precision)
        self.source = source  # an Artifact's record tells the input shapes (ncnn_feed)
        self.param, self.bin = _model_files(source)
        check_recorded(source, self.param)  # as its stage wrote it: an Artifact, or a path in one
        # what ncnn itself would run wrongly; the parsed graph serves every later check
        self._graph = check_model_files(self.param, self.bin)
        self.emulate = emulate
        self.emulation = check_emulate(emulate, precision, self._graph, self.bin)
        self.target = target
        self.arm = check_target(target, emulate, isolated)
        # SDPA layers that read a byte mask as float: a run may corrupt the process's memory
        self.byte_masks = byte_masks(self._graph)
        self.precision = precision
        self.num_threads = num_threads
        self.check_sizes = check_sizes
        self._declared_shapes(source)
        self._net = None
        ship = cops.for_worker(self.param) if isolated else b""  # see OrtRunner
        self.isolated = isolated and ship is not None
        if self.isolated:
            self._remote = self._twin(timeout, ship)
        elif self.arm is not None and not worker_main.SERVING:
            raise InputError(f"{self.param.name} holds Python custom layers that cannot "
                             f"travel to the {target} worker", "compare it on this machine's "
                             "ncnn (target=None), or give the op an ncnn kernel in C++")

    def _declared_shapes(self, source: Any) -> None:
        """The inputs' and outputs' specs the conversion declared (``_ncnn.py`` and the
        ``.pnnx.param``'s shapes); none without the script."""
        py = self.param.with_name(self.param.name[: -len(".ncnn.param")] + "_ncnn.py")
        self.in_specs, self.out_specs = parse_ncnn_py(py) if py.exists() else ({}, {})
        if self.in_specs or self.out_specs:
            declare_shapes(pnnx_param_for(source, self.param), self.in_specs,
                           self.out_specs)

    def _twin(self, timeout: float | None, ship: bytes) -> RemoteHandle:
        """The handle of this runner's twin: in the native worker, or its ARM target's."""
        where = self.precision + (f" {self.target}" if self.target else "")
        return RemoteHandle("workbench.runtime.ncnn_runner:NcnnRunner", (str(self.param),),
                            {"precision": self.precision, "num_threads": self.num_threads,
                             "emulate": self.emulate, "target": self.target},
                            f"ncnn ({self.emulate or where})", timeout=timeout,
                            custom_ops=ship,
                            place=arm_place(self.target) if self.target else NATIVE)

    @property
    def flags(self) -> NcnnFlags:
        """Exactly which ncnn precision features this runner's runs use (fp16 arithmetic
        only where the CPU has it: an ARMv8.2 target; never on x86, whose ncnn computes
        fp32)."""
        int8 = bool(self._int8_scales()) or any(
            str(ly.params.get(8, "0")).lstrip("-").isdigit() and int(ly.params.get(8, "0")) > 0
            for ly in self._graph.layers if ly.type in ("Convolution", "ConvolutionDepthWise",
                                                        "InnerProduct"))
        if self.emulation is not None:
            return ncnn_flags("fp32", False, int8, self.target)  # layers run fp32 here
        has = self.arm.fp16_arithmetic if self.arm is not None else False
        return ncnn_flags(self.precision, has, int8, self.target)

    @property
    def notes(self) -> list[Diagnostic]:
        """What the runner says of its precision: fp16 arithmetic asked of a target without
        it (what runs instead)."""
        if self.arm is None:
            return []
        note = instead(self.flags, f"target {self.target!r} ({self.arm.stands_for})")
        return [note] if note is not None else []

    @property
    def graph(self) -> Any:
        """The parsed ``.param`` (an NcnnParam), as checked when the runner was made."""
        return self._graph

    @property
    def net(self):
        if self._net is None:
            import ncnn

            net = ncnn.Net()
            # must be set before load_param: ncnn enables fp16 by default; emulated: fp32
            for flag, on in options(self.precision if self.emulation is None
                                    else "fp32").items():
                setattr(net.opt, flag, on)
            net.opt.num_threads = self.num_threads

            register_ncnn_layers(net, self.param)  # Python layers of @wb.custom_op ops
            # the param counts its .bin beside it (capacity.model_files: a list of both
            # counted each file twice, an ncnn net's need 3x its files instead of 1.5x)
            model_fits(self.param, f"an ncnn net of {self.param.name}", stage="ncnn-net")
            if net.load_param(str(self.param)) != 0:
                unknown = unloadable_layers(self.param)
                if unknown:

                    listing = ", ".join(f"{t} ({n})" for t, n in unknown[:8])

                    raise MissingOpError(
                        f"ncnn has no layer type for {listing} in {self.param.name}",
                        missing_ncnn_hint([t for t, _ in unknown]))
                raise InputError(f"ncnn cannot load {self.param.name}: a layer has parameters "
                                 "ncnn rejects", "convert again with wb.to_ncnn; `workbench "
                                 "inspect` lists the layers")

            if (net.load_model(str(self.bin)) if self.emulation is None else
                    load_rounded(net, self._graph, self.bin, self.emulation)) != 0:
                raise InputError(f"ncnn cannot load the weights {self.bin.name}: the file is "
                                 "shorter than the param needs (truncated or from another "
                                 "conversion)", "convert again; keep .param and .bin together")
            self._net = net
        return self._net

    def _describe_local(self) -> ModelIO:
        net = self.net
        names = list(self.in_specs) or list(net.input_names())
        return ModelIO(inputs=tuple(TensorSpec(n) for n in names),
                       outputs=tuple(self._model_outputs()),
                       blobs=tuple(b.name for b in net.blobs()))

    def _model_outputs(self) -> list[str]:
        """out0...outN as the ``_ncnn.py`` extracts them; without it, the blobs no layer reads
        that are not inputs (ncnn's output_names() also lists inputs the graph never reads),
        in outK order when pnnx named them so."""
        if self.out_specs:
            return list(self.out_specs)
        inputs = set(self.net.input_names())
        names = [n for n in self.net.output_names() if n not in inputs]
        if names and all(re.fullmatch(r"out\d+", n) for n in names):
            names.sort(key=lambda n: int(n[3:]))
        return names

    # -- Runner.run's hooks ----------------------------------------------------------------
    def _before_run(self, feed: dict[str, Any]) -> None:
        """A model whose run may corrupt this process's memory runs in the worker only."""
        if not self.byte_masks or self.isolated or worker_main.SERVING:
            return  # (the worker's twin: the parent retires that process after)
        raise ModelFileError(
            f"{self.param.name}: {describe_masks(self.byte_masks)}; ncnn's SDPA reads its "
            "mask as float, past the mask's end: a run may corrupt this process's memory or "
            "crash it, so it is not run in this process",
            f"run it with isolated=True (the default: a crash stays in the worker); {MASK_HINT}")

    def _explain_crash(self, feed: dict[str, Any], crashed: BackendCrashed) -> Exception:
        """The crash explained from its feed: the layer to blame (ncnn_failure, which
        re-runs the model layer by layer on this machine's ncnn: not for an ARM target,
        whose crash may be ARM's own; there the worker's log says what it printed)."""
        if self.arm is not None:
            crashed.hint = (f"ncnn's aarch64 build crashed under QEMU ({self.arm.qemu_cpu}, "
                            f"as {self.target}); compare the same model with target=None: if "
                            "it runs there, the crash is in ARM's kernels. " + crashed.hint)
            return crashed
        return self._explained(feed, "", crashed=crashed)

    def _after_run(self) -> None:
        if self.byte_masks and self.isolated:
            # no later run, of any model, in a heap this run may have damaged
            worker(self._remote.place).taint()

    def _fit_outputs(self, result: dict[str, Any], capture: Any) -> dict[str, Any]:
        """out0...outN first, in the torch model's order, each in its torch shape where the
        conversion declared one (``workbench.shapes.fit``); with capture="all", every other
        blob after them as ncnn holds it."""
        outs = self.output_names
        ordered = {n: shapes.fit(result[n], self._out_shape(n)) for n in outs if n in result}
        if capture == "all":
            ordered.update((n, v) for n, v in result.items() if n not in ordered)
        return ordered

    def _out_shape(self, name: str) -> tuple[int | None, ...] | None:
        spec = self.out_specs.get(name)
        return spec.shape if spec is not None else None

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs checked against the declared ones, before native code sees them.

        Args:
            inputs: a dict by input name, a tuple in input order, or one array.

        Returns:
            {input name: C-contiguous float32 or int32 array} in the shape ncnn is handed
            (``shapes.feed_shape``). Raises InputError naming the input, what the conversion
            declared and what came (count, names, rank, channels or features, dtype), with a
            hint for that cause.
        """
        import numpy as np

        names = self.input_names
        values = split_inputs(inputs, names, self.param.name)
        out = {}
        for name, v in zip(names, values, strict=True):
            if getattr(v, "is_meta", False):  # shape only: torch cannot copy it out
                raise InputError(f"input {name!r} of {self.param.name}: a meta tensor "
                                 "holds no values", "pass a tensor with data (on the CPU), e.g. "
                                 "torch.randn(shape)")
            arr = to_numpy(v)
            if arr.dtype.kind not in "fiub":
                raise InputError(f"input {name!r} of {self.param.name}: dtype {arr.dtype} is "
                                 "not numeric", "pass a float32 array (int32 for an index "
                                 "input such as an embedding's)")
            spec = self.in_specs.get(name)
            shape = check_input(self, name, arr, spec)

            # ncnn holds 4-byte values; its Mat is a copy (and the worker's file another)
            check_fits({name: arr}, self.param.name, copies=1 + self.isolated, itemsize=4,
                       what="the run copies it" + (" to the worker and into ncnn"
                                                   if self.isolated else " into ncnn"))
            integers = spec is not None and spec.dtype in INT_DTYPES
            if integers and arr.dtype.kind == "f":
                raise InputError(
                    f"input {name!r} of {self.param.name}: expected integers ({spec.dtype}, as "
                    f"converted), got {arr.dtype}",
                    "this input holds indices (an embedding, a gather): pass integers, e.g. "
                    "x.astype(np.int32) or tensor.int(); ncnn would read float bits as ints")
            # ncnn holds 4-byte values: an 8-byte array is read as garbage, so narrow (and
            # widen 1- and 2-byte ones) to int32 or float32
            want = "int32" if integers else "float32"
            if arr.dtype.name != want:
                arr = arr.astype(want)
            out[name] = np.ascontiguousarray(arr.reshape(shape))
        return out

    def run_blobs(self, blobs: dict[str, Any], wanted: list[str]) -> dict[str, Any]:
        """Feed any blobs (model inputs or intermediate ones, e.g. reference values) and
        extract ``wanted`` blobs from one extractor: what isolated comparison needs.

        Args:
            blobs: {blob name: array}; model inputs as ``feed`` returns them.
            wanted: the blobs to extract.

        Returns:
            {blob name: array} as ncnn holds each (no reshaping to torch shapes).
        """
        import numpy as np

        known = set(self.describe().blobs)
        unknown = sorted((set(blobs) | set(wanted)) - known)
        if unknown:
            raise InputError(f"{self.param.name} has no blob(s) {unknown[:5]}",
                             "blob names are listed by `workbench inspect` on the param")
        feed = {n: np.ascontiguousarray(_narrow(v)) for n, v in blobs.items()}
        capture = BlobCapture(tuple(wanted))
        if self.isolated:
            return self._remote.execute(feed, capture)
        return self._execute(feed, capture)

    def _mat(self, name: str, arr: Any) -> Any:
        """``arr`` as pnnx's script hands it to ncnn: with the input's batch axis, if any."""
        import ncnn

        spec = self.in_specs.get(name)
        batch = spec.batch_axis if spec is not None else (
            0 if name in self._batched_blobs() else None)  # an inner blob captured batched
        return ncnn.Mat(arr, batch_index=batch) if batch is not None else ncnn.Mat(arr)

    def _batched_blobs(self) -> set[str]:
        """Inner blobs a capture found holding a batch (ncnn's Mat.n > 1): fed back (an
        isolated run) with their batch axis first, as they were captured."""
        if not hasattr(self, "_batched"):
            self._batched: set[str] = set()
        return self._batched

    def _blob_array(self, name: str, mat: Any) -> Any:
        """A captured blob as numpy. A Mat holding a batch (Mat.n > 1: a batched input runs
        through) comes with its batch axis first; ``np.asarray`` gives the first item only."""
        import numpy as np

        if getattr(mat, "n", 1) > 1:
            self._batched_blobs().add(name)
            return np.array(mat.numpy(batch_index=0))
        return np.asarray(mat)  # a view that keeps the Mat alive, no copy

    def _execute(self, feed: dict[str, Any], capture: Any,
                 arena: Any = None) -> dict[str, Any]:
        """Run one extractor. ``arena`` (in the worker) is not used: the blobs are views of
        ncnn's Mats, which the worker writes to its reply file with pwrite. A copy through a
        mapping would hold a second resident copy of every blob while the Mats live."""
        import numpy as np

        if self.emulation is not None:  # storage rounded between layers

            return execute(self, feed, capture)

        if isinstance(capture, BlobCapture):  # run_blobs
            ex = self.net.create_extractor()
            ex.set_light_mode(False)
            for name, arr in feed.items():
                # cloned: a Mat made over numpy's buffer keeps numpy's layout, without the
                # aligned channel step ncnn's layers assume; Squeeze read garbage from one
                # fed as [18, 15, 19, 1] (a false isolated max abs 2.83). The clone is
                # ncnn's own Mat, laid out as its layers expect.
                ex.input(name, self._mat(name, arr).clone())
            out = {}
            for name in capture.names:
                ret, mat = ex.extract(name)
                if ret != 0 or bad_mat(mat):
                    raise self._explained(feed, f"ncnn extract({name!r}) returned {ret}")
                # a view that keeps the Mat alive, no copy; a fed blob views `arr`: copied
                out[name] = np.array(mat) if name in feed else self._blob_array(name, mat)
                if name in self._int8_scales() and name not in feed:
                    out[name] = out[name] / np.float32(self._int8_scales()[name])
            return out
        ex = self.net.create_extractor()
        ex.set_light_mode(capture == "outputs")
        for name, arr in feed.items():
            ex.input(name, self._mat(name, arr).clone())
        outputs = self._model_outputs()
        wanted = list(outputs)
        if capture == "all":  # the outputs first, then every other blob
            wanted += [b.name for b in self.net.blobs() if b.name not in set(outputs)]
        aliases = self._split_aliases() if capture == "all" else {}
        result = {}
        for name in wanted:
            if name in aliases and name not in outputs:  # a Split top is its bottom
                continue
            ret, mat = ex.extract(name)
            if ret != 0 or bad_mat(mat):
                raise self._explained(feed, f"ncnn extract({name!r}) returned {ret}"
                                      + (" an invalid blob" if ret == 0 else ""))
            spec = self.out_specs.get(name)
            if spec is not None and spec.batch_axis is not None:
                result[name] = np.array(mat.numpy(batch_index=spec.batch_axis))
            else:
                result[name] = self._blob_array(name, mat)
            if name in self._int8_scales():  # held in int8: the activation is value / scale
                result[name] = result[name] / np.float32(self._int8_scales()[name])
        for top, bottom in aliases.items():
            if bottom in result and top not in result:
                result[top] = result[bottom]
        return {name: result[name] for name in wanted if name in result}

    def _explained(self, feed: dict[str, Any], what: str, crashed: Any = None) -> Exception:
        """The error for a failed run, naming the layer to blame (see ncnn_failure; on an
        ARM target, ncnn's words only: the locator probes with this machine's ncnn)."""
        if self.arm is not None and crashed is None:
            return NcnnRunError(f"{self.param.name}: {what} in ncnn's aarch64 build "
                                f"({self.target}, QEMU {self.arm.qemu_cpu})",
                                "run the same model with target=None: if it fails there too, "
                                "its error names the layer; if not, the failure is ARM's own")
        batch = {n: s.batch_axis for n, s in self.in_specs.items()}
        if crashed is not None:
            err = explain_crash(self.param, self.bin, feed, self.precision, batch, crashed)
            if self.byte_masks:  # the cause is in the graph: say it, not "check the shapes"
                err.hint = note(self.byte_masks)
            return err
        return explain(self.param, self.bin, feed, self.precision, batch, what)

    def _int8_scales(self) -> dict[str, float]:
        """{blob: its int8 scale} of each blob an int8 layer hands on in int8 (ncnn2int8's
        requantize, ``8=`` above 100: the output scale is stored after the layer's
        weights). ncnn returns those blobs as the integers it holds; a capture divides
        them by their scale, so every consumer sees activations."""
        if not hasattr(self, "_int8"):
            self._int8: dict[str, float] = {}
            requant = {ly.name: ly.tops[0] for ly in self._graph.layers
                       if ly.tops and str(ly.params.get(8, "0")).lstrip("-").isdigit()
                       and int(ly.params.get(8, "0")) > 100}
            if requant:
                import numpy as np


                with open(self.param.with_suffix(".bin"), "rb") as f:
                    for blob in walk_bin(self._graph, self.param.with_suffix(".bin")).blobs:
                        if blob.role == "output_scale" and blob.layer in requant:
                            f.seek(blob.offset)
                            scale = float(np.fromfile(f, "<f4", 1)[0])
                            if scale > 0:
                                self._int8[requant[blob.layer]] = scale
        return self._int8

    def _split_aliases(self) -> dict[str, str]:
        """{Split top blob: its bottom blob}: ncnn's Split outputs share their input's data."""
        if not hasattr(self, "_aliases"):
            self._aliases = {top: layer.bottoms[0] for layer in self._graph.layers
                             if layer.type == "Split" for top in layer.tops}
        return self._aliases


def _model_files(source: Any) -> tuple[Path, Path]:
    """The .ncnn.param and .ncnn.bin of ``source`` (an Artifact or a path), both present."""
    param = Path(getattr(source, "path", source))
    if not param.name.endswith(".ncnn.param"):
        raise InputError(f"NcnnRunner needs a .ncnn.param file, got {param.name!r}",
                         "pass the artifact wb.to_ncnn returned, or its .ncnn.param path")
    bin_ = param.with_name(param.name[: -len(".param")] + ".bin")
    for f in (param, bin_):
        if not f.exists():
            raise InputError(f"ncnn model file {str(f)!r} does not exist",
                             "an ncnn model is a .ncnn.param and a .ncnn.bin side by side")
    return param, bin_


def _narrow(a: Any) -> Any:
    """8-byte dtypes to ncnn's 4-byte ones; ints stay ints."""
    import numpy as np

    a = np.asarray(to_numpy(a))
    return a.astype(np.int32 if a.dtype.kind in "iub" else np.float32, copy=False)
