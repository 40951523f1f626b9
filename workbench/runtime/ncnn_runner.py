"""NcnnRunner: an ncnn model (.ncnn.param + .ncnn.bin) with checked inputs.

ncnn crashes instead of raising on many mismatches (a 1-D array into a conv net, an 8-byte
dtype), so every input is checked against what pnnx declared before native code sees it.
The batch axis of each input and output is the one pnnx chose, read from the ``_ncnn.py``
it writes beside the param (never assumed to be axis 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import Runner, split_inputs, to_numpy

PRECISIONS = ("fp32", "fp16")
_TORCH_DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "int": "int32",
                 "long": "int64", "int64": "int64", "int32": "int32", "double": "float64",
                 "float64": "float64"}


@dataclass
class BlobSpec:
    name: str
    rank: int | None = None
    dtype: str = "float32"
    batch_axis: int | None = None
    example_shape: tuple[int, ...] | None = None


def parse_ncnn_py(path: Path) -> tuple[dict[str, BlobSpec], dict[str, BlobSpec]]:
    """Inputs and outputs as pnnx's generated ``_ncnn.py`` feeds and reads them."""
    text = path.read_text()
    inputs: dict[str, BlobSpec] = {}
    for m in re.finditer(r"^\s*(in\d+) = torch\.(rand|randint)\((.*)\)\s*$", text, re.M):
        name, args = m.group(1), m.group(3)
        dt = re.search(r"dtype=torch\.(\w+)", args)
        if m.group(2) == "randint":  # randint(high, (d0, d1, ...), dtype=...)
            shape = re.search(r"\(([\d,\s]*)\)", args)
            dims = shape.group(1) if shape else ""
        else:  # rand(d0, d1, ..., dtype=...)
            dims = args.split("dtype")[0]
        nums = [int(n) for n in re.findall(r"\d+", dims)]
        inputs[name] = BlobSpec(name, len(nums), _TORCH_DTYPES.get(dt.group(1) if dt else
                                                                     "float", "float32"),
                                example_shape=tuple(nums))
    for m in re.finditer(r'ex\.input\("([^"]+)", ncnn\.Mat\((\w+)\.numpy\(\)(?:, batch_index=(\d+))?',
                         text):
        spec = inputs.setdefault(m.group(2), BlobSpec(m.group(1)))
        spec.name = m.group(1)
        spec.batch_axis = int(m.group(3)) if m.group(3) else None
    outputs: dict[str, BlobSpec] = {}
    for m in re.finditer(r'_, (\w+) = ex\.extract\("([^"]+)"\)', text):
        outputs[m.group(2)] = BlobSpec(m.group(2))
        b = re.search(rf"{m.group(1)}\.numpy\(batch_index=(\d+)\)", text)
        outputs[m.group(2)].batch_axis = int(b.group(1)) if b else None
    return {s.name: s for s in inputs.values()}, outputs


class NcnnRunner(Runner):
    name = "ncnn"
    main_thread = True  # in the worker: ncnn was 20-50% slower run from another thread

    def __init__(self, source: Any, precision: str = "fp32", num_threads: int = 2,
                 isolated: bool = True, custom_ops: bytes | None = None) -> None:
        from ..stages import custom_ops as cops

        if precision not in PRECISIONS:
            raise InputError(f"precision={precision!r} is not one of {PRECISIONS}",
                             "fp32 for accuracy checks; fp16 is what ncnn does by default")
        self.param = Path(getattr(source, "path", source))
        if not self.param.name.endswith(".ncnn.param"):
            raise InputError(f"NcnnRunner needs a .ncnn.param file, got {self.param.name!r}",
                             "pass the artifact wb.to_ncnn returned, or its .ncnn.param path")
        self.bin = self.param.with_name(self.param.name[: -len(".param")] + ".bin")
        for f in (self.param, self.bin):
            if not f.exists():
                raise InputError(f"ncnn model file {str(f)!r} does not exist",
                                 "an ncnn model is a .ncnn.param and a .ncnn.bin side by side")
        self.precision = precision
        self.num_threads = num_threads
        py = self.param.with_name(self.param.name[: -len(".ncnn.param")] + "_ncnn.py")
        self.in_specs, self.out_specs = parse_ncnn_py(py) if py.exists() else ({}, {})
        if custom_ops is not None:  # the twin in the worker: @wb.custom_op layers it runs
            cops.install(custom_ops)
        ship = cops.for_worker(self.param) if isolated else {}  # see OrtRunner
        self.isolated = isolated = isolated and ship is not None
        self._net = None
        if isolated:
            from .worker import RemoteHandle

            self._remote = RemoteHandle("workbench.runtime.ncnn_runner:NcnnRunner",
                                        (str(self.param),),
                                        {"precision": precision, "num_threads": num_threads,
                                         **ship}, f"ncnn ({precision})")

    @property
    def net(self):
        if self._net is None:
            import ncnn

            net = ncnn.Net()
            fp16 = self.precision == "fp16"
            # must be set before load_param: ncnn enables fp16 by default
            net.opt.use_fp16_storage = fp16
            net.opt.use_fp16_packed = fp16
            net.opt.use_fp16_arithmetic = fp16
            net.opt.num_threads = self.num_threads
            from ..stages.custom_ops import register_ncnn_layers

            register_ncnn_layers(net, self.param)  # Python layers of @wb.custom_op ops
            if net.load_param(str(self.param)) != 0:
                from ..stages.ncnn import unloadable_layers

                unknown = unloadable_layers(self.param)
                if unknown:
                    from ..errors import MissingOpError

                    listing = ", ".join(f"{t} ({n})" for t, n in unknown[:8])
                    from ..stages.custom_ops import missing_ncnn_hint

                    raise MissingOpError(
                        f"ncnn has no layer type for {listing} in {self.param.name}",
                        missing_ncnn_hint([t for t, _ in unknown]))
                raise InputError(f"ncnn cannot load {self.param.name}: a layer has parameters "
                                 "ncnn rejects", "convert again with wb.to_ncnn; `workbench "
                                 "inspect` lists the layers")
            if net.load_model(str(self.bin)) != 0:
                raise InputError(f"ncnn cannot load the weights {self.bin.name}: the file is "
                                 "shorter than the param needs (truncated or from another "
                                 "conversion)", "convert again; keep .param and .bin together")
            self._net = net
        return self._net

    def _describe_local(self) -> dict[str, Any]:
        net = self.net
        return {"inputs": [{"name": n} for n in net.input_names()],
                "outputs": list(net.output_names()),
                "blobs": [b.name for b in net.blobs()]}

    def feed(self, inputs: Any) -> dict[str, Any]:
        """Inputs checked (names, count, rank, dtype) and made C-contiguous numpy arrays."""
        import numpy as np

        names = self.input_names
        values = split_inputs(inputs, names, self.param.name)
        out = {}
        for name, v in zip(names, values, strict=True):
            arr = to_numpy(v)
            spec = self.in_specs.get(name)
            if spec is not None and spec.rank is not None and arr.ndim != spec.rank:
                raise InputError(
                    f"input {name!r} of {self.param.name}: expected rank {spec.rank} "
                    f"(converted with shape {list(spec.example_shape or ())}), got shape "
                    f"{list(arr.shape)}", "feeding ncnn the wrong rank crashes it; reshape first")
            if arr.dtype.kind not in "fiub":
                raise InputError(f"input {name!r} of {self.param.name}: dtype {arr.dtype} is "
                                 "not numeric", "pass a float32 array")
            want = spec.dtype if spec is not None else "float32"
            # ncnn.Mat takes 8-byte arrays silently and then reads garbage: narrow them
            want = {"int64": "int32", "float64": "float32"}.get(want, want)
            if arr.dtype.name != want:
                arr = arr.astype(want)
            batch = spec is not None and spec.batch_axis is not None
            if not 1 <= arr.ndim - batch <= 4:
                raise InputError(f"input {name!r} of {self.param.name}: ncnn holds 1 to 4 axes "
                                 f"besides batch, got shape {list(arr.shape)}", "")
            out[name] = np.ascontiguousarray(arr)
        return out

    def run_blobs(self, blobs: dict[str, Any], wanted: list[str]) -> dict[str, Any]:
        """Feed any blobs (model inputs or intermediate ones, e.g. reference values) and
        extract ``wanted`` blobs from one extractor: what isolated comparison needs."""
        import numpy as np

        known = set(self.describe().get("blobs", ()))
        unknown = sorted((set(blobs) | set(wanted)) - known)
        if unknown:
            raise InputError(f"{self.param.name} has no blob(s) {unknown[:5]}",
                             "blob names are listed by `workbench inspect` on the param")
        def narrow(a: Any) -> Any:  # 8-byte dtypes to ncnn's 4-byte ones, ints stay ints
            a = np.asarray(to_numpy(a))
            return a.astype(np.int32 if a.dtype.kind in "iub" else np.float32, copy=False)

        feed = {n: np.ascontiguousarray(narrow(v)) for n, v in blobs.items()}
        capture = ("blobs", list(wanted))
        if self.isolated:
            return self._remote.execute(feed, capture)
        return self._execute(feed, capture)

    def _execute(self, feed: dict[str, Any], capture: Any,
                 arena: Any = None) -> dict[str, Any]:
        """Run one extractor. ``arena`` (in the worker) is not used: the blobs are views of
        ncnn's Mats, which the worker writes to its reply file with pwrite. A copy through a
        mapping would hold a second resident copy of every blob while the Mats live."""
        import ncnn
        import numpy as np

        if isinstance(capture, tuple):  # ("blobs", names): run_blobs
            ex = self.net.create_extractor()
            ex.set_light_mode(False)
            for name, arr in feed.items():
                spec = self.in_specs.get(name)
                batch = spec.batch_axis if spec is not None else None
                # no clone: out of light mode ncnn runs no layer in place, so a fed Mat
                # (a view of `arr`, alive until we return) is only read
                ex.input(name, ncnn.Mat(arr, batch_index=batch) if batch is not None
                         else ncnn.Mat(arr))
            out = {}
            for name in capture[1]:
                ret, mat = ex.extract(name)
                if ret != 0:
                    raise RuntimeError(f"ncnn extract({name!r}) returned {ret}")
                # a view that keeps the Mat alive, no copy; a fed blob views `arr`: copied
                out[name] = np.array(mat) if name in feed else np.asarray(mat)
            return out
        ex = self.net.create_extractor()
        ex.set_light_mode(capture == "outputs")
        for name, arr in feed.items():
            spec = self.in_specs.get(name)
            mat = (ncnn.Mat(arr, batch_index=spec.batch_axis)
                   if spec is not None and spec.batch_axis is not None else ncnn.Mat(arr))
            ex.input(name, mat.clone())
        wanted = (list(self.net.output_names()) if capture == "outputs"
                  else [b.name for b in self.net.blobs()])
        aliases = self._split_aliases() if capture == "all" else {}
        result = {}
        for name in wanted:
            if name in aliases:  # a Split top is its bottom: no second extract and copy
                continue
            ret, mat = ex.extract(name)
            if ret != 0:
                raise RuntimeError(f"ncnn extract({name!r}) returned {ret}")
            spec = self.out_specs.get(name)
            if spec is not None and spec.batch_axis is not None:
                result[name] = np.array(mat.numpy(batch_index=spec.batch_axis))
            else:
                result[name] = np.asarray(mat)  # a view that keeps the Mat alive, no copy
        for top, bottom in aliases.items():
            if bottom in result:
                result[top] = result[bottom]
        return {name: result[name] for name in wanted if name in result}

    def _split_aliases(self) -> dict[str, str]:
        """{Split top blob: its bottom blob}: ncnn's Split outputs share their input's data."""
        if not hasattr(self, "_aliases"):
            from ..params import parse_ncnn_param

            self._aliases = {top: layer.bottoms[0]
                             for layer in parse_ncnn_param(self.param).layers
                             if layer.type == "Split" for top in layer.tops}
        return self._aliases
