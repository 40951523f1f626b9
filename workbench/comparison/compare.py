"""wb.compare: every intermediate tensor of each candidate against the PyTorch reference.

Runners capture (one pass each), ``align`` maps candidate tensors to modules, metrics are
computed per aligned pair. Accumulated error: each backend runs end to end. Isolated error
(ONNX): one rewritten graph in which every aligned intermediate value is cut and fed from
the reference, so each op (or the small unaligned subgraph before it) runs on reference
inputs, all in one session run. Runners know nothing of this (Polygraphy's split).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .align import CandidateTensor, align, samples
from .verdict import MIN_EXPLAINED, measure_pair, same_elements, shape_relation

MODES = ("accumulated", "isolated", "both")


@dataclass
class Candidate:
    """A candidate backend: its runner, a display name, and how to list its tensors."""

    name: str
    runner: Any
    kind: str  # "onnx" | "ncnn"
    path: Path
    own: bool = False  # a runner compare built (and keeps), not one it was given


def _as_candidate(thing: Any, index: int) -> Candidate:
    from ..runtime import NcnnRunner, OrtRunner, Runner, runner_for

    runner = thing if isinstance(thing, Runner) else None
    if runner is None:
        try:
            # one intra-op thread: compare runs the captures in the worker on one core
            # while torch and the measuring pass take the other (see compare())
            runner = _cached_runner(thing, lambda t: runner_for(t, num_threads=1))
        except InputError as e:
            raise InputError(f"candidate {index} ({type(thing).__name__}): {e.message}",
                             e.hint) from None
    own = runner is not thing
    if isinstance(runner, OrtRunner):
        int8 = " int8" if _stored_precision(thing) == "int8" else ""
        return Candidate(f"onnxruntime{int8} {_label(thing, runner.path)}", runner, "onnx",
                         runner.path, own)
    if isinstance(runner, NcnnRunner):
        precision = "int8" if _stored_precision(thing) == "int8" else runner.precision
        if getattr(runner, "emulate", None):  # storage rounded between layers, not native
            precision = f"{precision} emulated {runner.emulate}"
        return Candidate(f"ncnn {precision} {_label(thing, runner.param)}", runner,
                         "ncnn", runner.param, own)
    raise InputError(f"candidate {index} is a {type(runner).__name__}; compare takes ONNX or "
                     "ncnn artifacts, paths or their runners", "e.g. wb.compare(model, [onx, nc], "
                     "(x,))")


_RUNNERS: OrderedDict[tuple, Any] = OrderedDict()
_RUNNER_CACHE_SIZE = 4


def _cached_runner(thing: Any, make: Any) -> Any:
    """The runner for an artifact or path, kept across calls (a few, least recently used
    dropped) while its file is unchanged: re-running a comparison in a notebook then reuses
    the sessions and nets the worker already built."""
    path = getattr(thing, "path", thing)
    try:
        st = Path(path).stat()
    except (OSError, TypeError):
        return make(thing)  # not a file: runner_for says what it is
    key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    if key in _RUNNERS:
        _RUNNERS.move_to_end(key)
        return _RUNNERS[key]
    runner = _RUNNERS[key] = make(thing)
    while len(_RUNNERS) > _RUNNER_CACHE_SIZE:
        _RUNNERS.popitem(last=False)  # its worker twin goes with it
    return runner


def _stored_precision(thing: Any) -> str | None:
    """The precision the quantize stage recorded on an artifact (None for others)."""
    params = getattr(thing, "params", None)
    return params.get("precision") if isinstance(params, dict) else None


def _label(thing: Any, path: Path) -> str:
    """The artifact id; for a runner or path, the artifact folder or the file name."""
    label = getattr(thing, "id", None)
    if label:
        return label
    return path.parent.name if (path.parent / "artifact.json").exists() else path.name


_TENSORS: OrderedDict[tuple, list[CandidateTensor]] = OrderedDict()


def candidate_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    """The tensors a candidate produces, in topological order, with module hints. Kept for
    an unchanged file (parsing a ResNet-50's ONNX took longer than aligning it)."""
    st = cand.path.stat()
    key = (cand.kind, str(cand.path.resolve()), st.st_mtime_ns, st.st_size,
           frozenset(modules))
    if key not in _TENSORS:
        _TENSORS[key] = _candidate_tensors(cand, modules)
        while len(_TENSORS) > _RUNNER_CACHE_SIZE:
            _TENSORS.popitem(last=False)
    _TENSORS.move_to_end(key)
    return _TENSORS[key]


def _candidate_tensors(cand: Candidate, modules: set[str]) -> list[CandidateTensor]:
    if cand.kind == "onnx":
        from ..onnx_io import load_onnx
        from .align import module_from_metadata, module_from_scope

        model = load_onnx(cand.path, external_data=False)
        # (the node's own name when its output is a graph output: '/fc/Add' -> 'output')
        hints = [module_from_metadata(n, modules) or next(
            (h for o in (*n.output, n.name) if o and (h := module_from_scope(o, modules))
             is not None), None) for n in model.graph.node]
        scopes = [_scope(n) for n in model.graph.node]  # the call, not only the module
        readers: dict[str, set] = {}
        reader_scopes: dict[str, set] = {}
        for node, hint, scope in zip(model.graph.node, hints, scopes, strict=True):
            for name in node.input:
                readers.setdefault(name, set()).add(hint)
                reader_scopes.setdefault(name, set()).add(scope)
        outputs = {o.name: k for k, o in enumerate(model.graph.output)}
        # values computed from weights alone (an Identity of a shared parameter, a folded
        # Constant): parameters, not activations
        constant = {t.name for t in model.graph.initializer}
        out = []
        for i, (node, hint, scope) in enumerate(zip(model.graph.node, hints, scopes,
                                                    strict=True)):
            is_const = node.op_type == "Constant" or (
                node.input and all(not n or n in constant for n in node.input))
            for name in node.output:
                if name:
                    if is_const:
                        constant.add(name)
                    internal = (hint is not None and name not in outputs
                                and readers.get(name, set()) == {hint})
                    own = (hint is not None and scope is not None and name not in outputs
                           and scope in reader_scopes.get(name, ()))
                    out.append(CandidateTensor(name, i, "Constant" if is_const
                                               else node.op_type, hint, internal,
                                               outputs.get(name), own, node=node.name,
                                               inputs=tuple(n for n in node.input if n)))
        return out
    from ..params import parse_ncnn_param

    out = []
    layers = parse_ncnn_param(cand.path).layers
    alias = {top: layer.bottoms[0] for layer in layers if layer.type == "Split"
             for top in layer.tops}

    def source(blob: str) -> str:  # a Split's top is its bottom
        while blob in alias:
            blob = alias[blob]
        return blob

    for i, layer in enumerate(layers):
        if layer.type in ("Input", "Split", "MemoryData"):
            continue  # inputs, aliases of their bottom, constants
        # pnnx names the model's outputs out0, out1... in torch's order
        out.extend(CandidateTensor(top, i, layer.type, output_index=int(top[3:])
                                   if re.fullmatch(r"out\d+", top) else None,
                                   node=layer.name,
                                   inputs=tuple(source(b) for b in layer.bottoms))
                   for top in layer.tops)
    return out


def _with_weights(tensors: list[CandidateTensor], cand: Candidate,
                  reference: Any) -> list[CandidateTensor]:
    """ncnn's tensors, each with the modules whose weights its layer holds (``weights_of``):
    what ties a layer to its module when its values do not (a fault, a fused op)."""
    if cand.kind != "ncnn" or not hasattr(reference, "named_modules"):
        return tensors
    from .weights import ncnn_weight_modules

    held = ncnn_weight_modules(cand.path, reference)
    if not held:
        return tensors
    out = [dataclasses.replace(t, weights_of=held[t.node]) if t.node in held else t
           for t in tensors]
    first_top = {}  # layer -> its first top (tensors are listed in each layer's top order)
    for t in out:
        first_top.setdefault(t.node, t.name)
    # A multi-layer LSTM/GRU/RNN is one torch call and one ncnn layer per torch layer: the
    # layers before the last, and the last one's state outputs (torch returns the states
    # of every layer stacked), are steps inside the module, aligned only when equal to one
    # of its records. The last layer's output stays pinned to the module by its weights.
    last: dict[str, int] = {}
    for t in out:
        if t.op_type in RECURRENT and len(t.weights_of) == 1:
            last[t.weights_of[0]] = max(last.get(t.weights_of[0], -1), t.order)
    return [dataclasses.replace(t, hint=t.weights_of[0], internal=True)
            if t.op_type in RECURRENT and len(t.weights_of) == 1 and (
                t.order < last[t.weights_of[0]] or t.name != first_top[t.node])
            else t for t in out]


RECURRENT = ("LSTM", "GRU", "RNN")


def _scope(node: Any) -> str | None:
    """The call a node belongs to: its scope in its output's name ('/layer1/relu_1'), or its
    name_scopes metadata (dynamo); None when neither says."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return prop.value
    for name in (*node.output, node.name):
        if name.startswith("/") and name.count("/") > 1:
            return name.rsplit("/", 1)[0]
    return None


@dataclass
class Record:
    """One aligned tensor of one candidate in one mode, with its metrics."""

    candidate: str
    mode: str
    order: int
    name: str
    reference: str
    op_type: str
    metrics: dict[str, Any]
    relation: str = "equal"  # how the candidate tensor relates to the reference tensor
    covers: tuple[str, ...] = ()  # the reference records a folded tensor spans
    node: str = ""  # the candidate's node (ONNX) or layer (ncnn) that wrote it

    @property
    def exact(self) -> bool:
        """Related to its reference tensor exactly (equal, or equal up to a known folding or
        a reshape): its error is the op's own, so it may be named as a divergence."""
        return self.relation.startswith("equal")

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "mode": self.mode, "order": self.order,
                "name": self.name, "reference": self.reference, "op_type": self.op_type,
                **self.metrics, "relation": self.relation}


def _input_sets(inputs: Any) -> list[tuple]:
    from ..inputs import as_tensor_tuple

    if isinstance(inputs, list) and inputs and all(isinstance(i, (tuple, list)) for i in inputs):
        return [as_tensor_tuple(i, f"inputs[{k}]") for k, i in enumerate(inputs)]
    return [as_tensor_tuple(inputs)]


def _copies(args: tuple) -> tuple:
    """A copy of each input tensor, for one backend's run."""
    return tuple(a.clone() for a in args)


def _fit(ref: Any, like_shape: tuple[int, ...]) -> Any:
    """A reference array reshaped to a candidate tensor's shape (batch axis added/dropped)."""
    import numpy as np

    ref = np.asarray(ref)
    if ref.shape == tuple(like_shape):
        return ref
    if same_elements(ref.shape, tuple(like_shape)):
        return ref.reshape(like_shape)
    raise InputError(f"reference shape {list(ref.shape)} cannot feed a candidate tensor of "
                     f"shape {list(like_shape)}",
                     "the candidate was converted with other input shapes; compare on the "
                     "shapes it was exported or converted with")


def compare(reference: Any, candidates: Any, inputs: Any, *, mode: str = "accumulated",
            tolerance: Any = None, per_op_tolerance: dict[str, Any] | None = None,
            per_tensor_tolerance: dict[str, Any] | None = None,
            progress: bool = True, min_explained: float = MIN_EXPLAINED,
            timeout: float | None = None) -> Any:
    """Compare candidates (ONNX/ncnn artifacts, paths or runners) with ``reference`` (an
    ``nn.Module`` or runner) op by op on ``inputs`` (a tuple, or a list of tuples whose
    metrics aggregate to the worst). Returns a CompareReport.

    Every backend runs on its own copy of the inputs (the caller's never change). A
    candidate with nothing compared, or with less than ``min_explained`` of its tensors
    aligned or attributed, is not ok (``report.summary()`` says why); a pair that cannot be
    measured is listed in ``report.unmeasured`` and the comparison goes on. ``timeout``
    (seconds) bounds each run of a candidate in the worker (BackendTimeout past it; default:
    each runner's own, scaled with its model)."""
    import numpy as np
    from tqdm.auto import tqdm

    from ..runtime import TorchRunner, runner_for
    from .metrics import Tolerance, resolve_tolerance
    from .report import CompareReport

    if mode not in MODES:
        raise InputError(f"mode={mode!r} is not one of {MODES}",
                         "'accumulated' runs each backend end to end; 'isolated' feeds each op "
                         "reference inputs; 'both'")
    if isinstance(min_explained, bool) or not isinstance(min_explained, (int, float)) \
            or not 0 <= min_explained < float("inf"):
        raise InputError(f"min_explained={min_explained!r}: expected a share from 0 to 1",
                         "e.g. min_explained=0.5: below half of a candidate's tensors "
                         "aligned or attributed, its comparison is not ok")
    ref_runner = runner_for(reference)  # an nn.Module becomes a TorchRunner
    if not isinstance(candidates, (list, tuple)):
        candidates = [candidates]
    if not candidates:
        raise InputError("no candidates to compare", "wb.compare(model, [onnx_artifact], (x,))")
    cands = [_as_candidate(c, i) for i, c in enumerate(candidates)]
    seen: dict[str, int] = {}
    for c in cands:  # two candidates never share a name: records are keyed by it
        seen[c.name] = seen.get(c.name, 0) + 1
        if seen[c.name] > 1:
            c.name = f"{c.name} #{seen[c.name]}"
    for c in cands:
        remote = getattr(c.runner, "_remote", None)
        if timeout is not None and remote is not None:
            c.runner.timeout = timeout  # checked by the runner: seconds > 0
        if c.own and remote is not None:
            # its results' files stay mapped between comparisons (no ~10 ms per 100 MB of
            # mapping again); not in isolated mode, whose peak resident set is the tighter
            remote.keep_mapped = mode == "accumulated"
    sets = _input_sets(inputs)
    base_tol = tolerance if isinstance(tolerance, Tolerance) else (
        Tolerance() if tolerance is None else resolve_tolerance(tolerance, None, None, "", ""))
    modules = {n for n, _ in reference.named_modules()} if hasattr(reference,
                                                                   "named_modules") else set()
    alignments: dict[str, Any] = {}
    tensors_of: dict[str, list[CandidateTensor]] = {}
    isolated_available: dict[str, bool] = {}
    steps = len(sets) * (1 + len(cands) * (2 if mode == "both" else 1))
    bar = tqdm(total=steps, desc="compare", disable=not progress, leave=False)
    worst: dict[tuple[str, str, str], Record] = {}
    unmeasured: dict[str, dict[str, str]] = {c.name: {} for c in cands}
    # Scheduling on a small machine (2 cores here): the candidates' runners (built here)
    # use one intra-op thread each and capture at once in the worker, while this thread
    # captures torch (one thread too) and then aligns and measures whatever capture is
    # done. Single-threaded runs share cores by plain time slicing; multi-threaded ones
    # on too few cores wait at every barrier (ncnn ran twice as slow beside a 2-thread
    # torch), and one at a time leaves cores idle. Captures run at most one ahead of the
    # measuring (two candidates' values alive at once); in isolated mode the next starts
    # only once this one is measured (peak memory). The measuring pass splits over two
    # threads.
    pool = ThreadPoolExecutor(1, thread_name_prefix="wb-compare-measure")
    try:
        pool.submit(_warm_metrics)  # numba loads or compiles its kernel meanwhile
        for args in sets:
            for cand in cands:
                n_in = len(cand.runner.input_names)
                if n_in != len(args):
                    raise InputError(f"{cand.name} takes {n_in} input(s) "
                                     f"{cand.runner.input_names}, the reference was given "
                                     f"{len(args)}", "compare a candidate exported from the "
                                     "same model and inputs")
            # each backend its own copy: a model writing into its input changes no other's
            # (a TorchRunner copies for itself)
            own_args = [_copies(args) for _ in cands]
            captures = _Captures(cands, own_args, ahead=1 if mode == "accumulated" else 0)
            try:
                bar.set_postfix_str("torch")
                with _torch_threads(1):
                    ref_values = ref_runner.run(args if isinstance(ref_runner, TorchRunner)
                                                else _copies(args), capture="all")
                bar.update()
                # align scores samples: the reference's are taken now, while the captures
                # run, and each candidate's in its capture thread
                ref_samples = samples(ref_values)
                for k, cand in enumerate(cands):
                    bar.set_postfix_str(cand.name)
                    values, cand_samples = captures.get(k)
                    if cand.name not in tensors_of:  # list and align on the first input set
                        tensors_of[cand.name] = _with_weights(
                            candidate_tensors(cand, modules), cand, reference)
                    tensors = tensors_of[cand.name]
                    if cand.name not in alignments:
                        alignments[cand.name] = align(ref_values, values, tensors, modules,
                                                      ref_samples, cand_samples)
                    cand_samples = None
                    al = alignments[cand.name]
                    order = {t.name: t for t in tensors}
                    runs = [] if mode == "isolated" else [("accumulated", values)]
                    if mode in ("isolated", "both"):
                        # isolated runs need the captured shapes, not values: in "isolated"
                        # mode the values go before the run (peak memory)
                        layout = {n: (np.shape(v), np.asarray(v).dtype)
                                  for n, v in values.items()}
                        values = None
                        iso = _isolated(cand, al, ref_values, layout, own_args[k])
                        isolated_available[cand.name] = iso is not None
                        if iso is not None:
                            runs.append(("isolated", iso))
                        iso = None  # what is measured is in runs
                    for run_mode, vals in runs:
                        jobs = []
                        for cname, rname in al.pairs.items():
                            if cname in vals:
                                t = order[cname]
                                jobs.append((t, rname, resolve_tolerance(
                                    base_tol, per_op_tolerance, per_tensor_tolerance,
                                    t.op_type, cname)))

                        def measure(job: tuple, vals: dict = vals,
                                    ref_values: dict = ref_values) -> dict[str, Any] | str:
                            t, rname, tol = job
                            return measure_pair(ref_values[rname], vals[t.name], tol)

                        # split over two threads, also while a capture runs: every thread
                        # here is single-threaded work, so a third one only time-slices
                        ms = _measure_split(pool, measure, jobs)
                        for (t, rname, _), m in zip(jobs, ms, strict=True):
                            if isinstance(m, str):  # listed with its reason; the rest goes on
                                unmeasured[cand.name][t.name] = f"{run_mode}: {m}"
                                continue
                            shapes = shape_relation(np.shape(ref_values[rname]),
                                                    np.shape(vals[t.name]))
                            relation = al.relation(t.name)
                            rec = Record(cand.name, run_mode, t.order, t.name, rname,
                                         t.op_type, m, f"{relation}; {shapes}" if shapes
                                         else relation, al.covers.get(t.name, ()), t.node)
                            key = (cand.name, run_mode, t.name)
                            if key not in worst or _worse(m, worst[key].metrics):
                                worst[key] = rec
                        bar.update()
                    runs = vals = measure = None  # the closure holds the values too
                    captures.done(k)
            finally:
                captures.stop()
    finally:
        pool.shutdown(cancel_futures=True)
    bar.close()
    records = sorted(worst.values(), key=lambda r: (r.candidate, r.mode, r.order))
    return CompareReport(records=records, alignments=alignments, candidates=cands,
                         isolated_available=isolated_available, tolerance=base_tol,
                         inputs=sets[0], reference=ref_runner, unmeasured=unmeasured,
                         min_explained=min_explained)



class _Captures:
    """Each candidate's capture="all" run, each in a thread of its own (the worker runs
    them at once), at most ``ahead`` captures ahead of the candidate being measured:
    ``done(k)`` lets capture k + 1 + ahead start."""

    def __init__(self, cands: list[Candidate], args: list[tuple], ahead: int) -> None:
        from concurrent.futures import Future

        self.futures: list[Future] = [Future() for _ in cands]
        self.slots = threading.Semaphore(1 + ahead)
        self.stopped = False
        threading.Thread(target=self._run, args=(cands, args), daemon=True,
                         name="wb-compare-captures").start()

    def _run(self, cands: list[Candidate], args: list[tuple]) -> None:
        for fut, cand, own in zip(self.futures, cands, args, strict=True):
            self.slots.acquire()
            if self.stopped:
                return
            threading.Thread(target=self._capture, args=(fut, cand, own), daemon=True,
                             name="wb-compare-capture").start()

    @staticmethod
    def _capture(fut: Any, cand: Candidate, args: tuple) -> None:
        try:
            values = cand.runner.run(args, "all")
            fut.set_result((values, samples(values)))
        except BaseException as e:  # noqa: BLE001 - raised where the result is read
            fut.set_exception(e)

    def get(self, k: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(values, align samples of them) of candidate k's capture, once: not kept here,
        so the caller decides when the values go."""
        from concurrent.futures import Future

        result = self.futures[k].result()
        self.futures[k] = spent = Future()
        spent.set_result(None)
        return result

    def done(self, k: int) -> None:
        """Candidate k is measured: the next capture may start (call once per k)."""
        self.slots.release()

    def stop(self) -> None:
        """No further captures; those running finish in the worker."""
        self.stopped = True
        self.slots.release(len(self.futures))


@contextlib.contextmanager
def _torch_threads(n: int) -> Any:
    """torch's intra-op threads set to ``n`` for the block (process-wide), then restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _warm_metrics() -> None:
    """Build (or load from numba's cache) the metrics kernel for float32 pairs."""
    import numpy as np

    from .metrics import Tolerance, tensor_metrics

    tensor_metrics(np.zeros(2, np.float32), np.zeros(2, np.float32), Tolerance())


def _measure_split(pool: Any, measure: Any, jobs: list) -> list[dict[str, Any]]:
    """measure(job) for every job, every other one in a pool thread (alternate jobs, so
    both halves get large and small tensors alike): the metrics kernel releases the GIL,
    so the two halves run on two cores."""
    odd = pool.submit(lambda: [measure(j) for j in jobs[1::2]])
    even = [measure(j) for j in jobs[0::2]]
    out: list[dict[str, Any]] = [{}] * len(jobs)
    out[0::2], out[1::2] = even, odd.result()
    return out


def _worse(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("max_abs") or 0.0) > (b.get("max_abs") or 0.0)


_ISOLATED: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()  # key -> (temp dir, runner)


def _isolated(cand: Candidate, al: Any, ref_values: dict[str, Any],
              layout: dict[str, tuple], args: tuple) -> dict[str, Any] | None:
    """Each op of an ONNX candidate run on reference inputs, all in one session run. The
    rewritten model and its runner are kept (two at most) for the next comparison."""
    import numpy as np

    if cand.kind == "ncnn":
        return _isolated_ncnn(cand, al, ref_values, layout, cand.runner.feed(args))
    cut = sorted(v for v in al.pairs if v in layout)  # capture="all" holds every node output
    if not cut:  # nothing aligned: nothing to run (a graph needs an output)
        return {}
    st = cand.path.stat()
    key = (str(cand.path.resolve()), st.st_mtime_ns, st.st_size, tuple(cut))
    if key not in _ISOLATED:
        import tempfile

        import onnx

        from ..runtime.ort_runner import OrtRunner

        d = tempfile.TemporaryDirectory(prefix="wb-isolated-")
        path = Path(d.name) / "isolated.onnx"
        types = {v: layout[v][1] for v in cut}
        onnx.save(isolated_model(cand.path, cut, types), str(path))
        _ISOLATED[key] = (d, OrtRunner(path, isolated=cand.runner.isolated,
                                       libraries=getattr(cand.runner, "libraries", ()),
                                       timeout=cand.runner.timeout))
        while len(_ISOLATED) > 2:
            _ISOLATED.popitem(last=False)[1][0].cleanup()
    _ISOLATED.move_to_end(key)
    feeds = dict(cand.runner.feed(args))
    for name in cut:
        shape, dtype = layout[name]
        ref = _fit(ref_values[al.pairs[name]], shape).astype(dtype, copy=False)
        feeds[f"{name}__ref"] = np.ascontiguousarray(ref)
    return _ISOLATED[key][1].run(feeds)


def isolated_model(path: Path, cut: list[str], types: dict[str, Any]) -> Any:
    """The ONNX model with the values in ``cut`` cut: their consumers read a new graph input
    ``<value>__ref`` (fed from the reference); chains of values not cut (the nodes a module
    was lowered into) stay connected, so they run from the nearest reference inputs. Its
    outputs are the cut values, as their nodes compute them: only what is measured."""
    from onnx import helper

    from ..onnx_io import load_onnx

    model = load_onnx(path)
    graph = model.graph
    cut_set = set(cut)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in cut_set:
                node.input[k] = f"{name}__ref"
    for name in cut:  # no shape: the same model serves every input size
        graph.input.append(helper.make_tensor_value_info(
            f"{name}__ref", helper.np_dtype_to_tensor_dtype(types[name]), None))
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(types[name]), None) for name in cut)
    return model


def _isolated_ncnn(cand: Candidate, al: Any, ref_values: dict[str, Any],
                   layout: dict[str, tuple], model_inputs: dict[str, Any]) -> dict[str, Any]:
    """Each ncnn layer on reference inputs: aligned bottoms are fed from the reference with
    Extractor.input, in as few passes as the graph allows (a layer cannot be measured in the
    pass that feeds its own output to another layer; greedy colouring, 2-3 passes)."""
    from ..params import parse_ncnn_param

    layers = [ly for ly in parse_ncnn_param(cand.path).layers
              if ly.type not in ("Input", "MemoryData")]
    alias = {top: ly.bottoms[0] for ly in layers if ly.type == "Split" for top in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    fed_of = {}  # layer name -> blobs to feed (Split tops fed as the blob they copy)
    for ly in layers:
        if ly.type == "Split":
            continue
        fed_of[ly.name] = {b: root(b) for b in ly.bottoms if root(b) in al.pairs}
    passes: list[tuple[set, dict, list]] = []  # (measured tops, feeds blob->source, layers)
    for ly in layers:
        if ly.type == "Split" or not any(t in al.pairs for t in ly.tops):
            continue
        feeds = fed_of[ly.name]
        for tops, fed, members in passes:
            clash = (set(ly.tops) & {root(b) for b in fed} or set(ly.tops) & set(fed.values())
                     or {src for src in feeds.values()} & tops)
            if not clash:
                tops.update(ly.tops)
                fed.update(feeds)
                members.append(ly)
                break
        else:
            passes.append((set(ly.tops), dict(feeds), [ly]))
    out: dict[str, Any] = {}
    for tops, fed, _members in passes:
        blobs = dict(model_inputs)  # the model's own inputs, as they are
        blobs.update({b: _fit(ref_values[al.pairs[src]], layout[src][0])
                      for b, src in fed.items() if src in layout})
        wanted = [t for t in tops if t in al.pairs]
        out.update(cand.runner.run_blobs(blobs, wanted))
    return out
