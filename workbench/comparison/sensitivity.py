"""Which layers cost a low-precision candidate its accuracy: a sensitivity ranking.

For each layer that ran in low precision (``precision/lowprec.py``: an int8 layer of an ncnn
int8 model, a node of a QDQ model whose own computation holds a DequantizeLinear or an
integer op, every layer of an fp16 run), aligned exactly to a call of the PyTorch reference,
the candidate's *isolated* output of that layer (the layer run on reference inputs: its own
error, nothing accumulated) is put in place of the call's output in an otherwise float
PyTorch run (``inject.py``: a module's forward hook, or the functional call the TorchRunner
names, returning it), and the final outputs are measured against the clean run. The layers
whose own error costs the final output most come first: the ones to keep in float
(``wb.quantize(..., exclude=rep.sensitive(k))``). This is PPQ's layerwise analysis carried to
the model's output, with the module named. A quantized candidate's layer is ranked when its
float parent pairs its tensor, whether or not the candidate's own (noisy) values let the
comparison pair it: the records the comparison lacks are made from the parent's pairs.

Not ranked, and listed apart in the ``Ranking``: layers that ran in float (their isolated
error is fp32's rounding, ~140 dB: a BatchNorm ncnn keeps float ranked first while the int8
layers went unmeasured), and layers whose value cannot be put back into the torch run (the
reason is given). The model input rounded to int8 by the first quantized layer is no layer's
error: it is measured on its own (``Ranking.input_rounding``: "input rounding: X dB"), and
the layers that read it are measured on the rounded input, so it is neither blamed on them
nor offered as an exclusion.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from ..errors import InputError
from .candidates import copies as _copies
from .candidates import float_parent as _float_parent
from .candidates import parent_pairing
from .isolated import fit_reference as _fit
from .isolated import isolated as _isolated
from .isolated import reference_of
from .ranking import Choice, InputRounding, Ranking, Sensitivity
from .schedule import torch_threads

_BEFORE = 6  # the bar's steps before the layers: 2 captures, pairs, isolated, lowering, input


class _Steps:
    """One progress bar over a whole ranking (tqdm.auto: a widget in Jupyter), a step per
    layer measured and per step around them, each step's wall time kept (``seconds``). The
    bar stays until the ranking returns: a phase that measures nothing still moves it."""

    def __init__(self, desc: str, total: int, progress: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
        self.seconds: dict[str, float] = {}
        self._name, self._t0 = "", time.perf_counter()

    def phase(self, name: str) -> None:
        """Start step ``name``: the bar says it, its seconds are counted."""
        self._stop()
        self._name, self._t0 = name, time.perf_counter()
        self.bar.set_postfix_str(name, refresh=True)

    def grow(self, steps: int) -> None:
        """``steps`` more to the bar's total (known only once the isolated run is done).
        Through ``reset``: a notebook bar takes a new total only there."""
        if steps:
            n = self.bar.n
            self.bar.reset(total=self.bar.total + steps)
            self.bar.update(n)

    def step(self, n: int = 1) -> None:
        self.bar.update(n)

    def _stop(self) -> None:
        if self._name:
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + (
                time.perf_counter() - self._t0)

    def close(self) -> dict[str, float]:
        self._stop()
        self._name = ""
        self.bar.close()
        return self.seconds


def sensitivity(report: Any, candidate: str | None = None, progress: bool = True
                ) -> Ranking:
    """The layers of ``candidate`` (default: the low-precision candidate whose output is
    furthest from the reference's) that ran in low precision, most costly first, with the
    float, unmeasurable and input-rounding lines beside them and which candidate it ranked
    among which (``Ranking.choice``). ``progress``: one bar over the whole ranking."""
    from ..runtime import TorchRunner

    ref_runner = report.reference
    if not isinstance(ref_runner, TorchRunner):
        raise InputError("sensitivity puts layer outputs back into the PyTorch model; this "
                         f"comparison's reference is a {type(ref_runner).__name__}",
                         "compare against the nn.Module: wb.compare(model, [...], inputs)")
    cand = _pick(report, candidate)
    with torch_threads(1):  # as the comparison's own torch runs (schedule.py)
        ranking = _rank(report, cand, ref_runner, progress)
    ranking.choice = _choice(report)
    return ranking


def _rank(report: Any, cand: Any, ref_runner: Any, progress: bool) -> Ranking:
    """sensitivity()'s work, on checked arguments, in steps a progress bar follows."""
    import numpy as np

    from ..precision.lowprec import lowering
    from .inject import TorchInjector

    records = _records(report, cand)
    args = report.inputs
    steps = _Steps(f"sensitivity of {cand.name}", _BEFORE + len(records), progress)
    try:
        steps.phase("capture")
        ref_values = ref_runner.run(_copies(args), capture="all")
        steps.step()
        values = cand.runner.run(_copies(args), capture="all")
        steps.step()
        layout = {n: (np.shape(v), np.asarray(v).dtype) for n, v in values.items()}
        values = None
        floats = {n for n, (_, dtype) in layout.items() if dtype.kind == "f"}
        steps.phase("float parent's pairs")
        al, records, covers = _parent_paired(report, cand, records, floats)
        steps.step()
        steps.phase("isolated run")
        iso = _isolated(cand, al, ref_values, layout, _copies(args)) or {}
        extra = _unrecorded(report, cand, al, records, floats, covers, iso, ref_values)
        records += extra
        plan = _blame_plan(cand, records) if cand.kind == "ncnn" else []
        steps.grow(len(extra) + len(plan))
        steps.step()
        steps.phase("lowering and clean run")
        cut = set(al.pairs) if cand.kind == "ncnn" else set(al.pairs) & set(layout)
        low = lowering(cand.path, cand.kind, cand.precision, cut)
        inj = TorchInjector(ref_runner, args)
        steps.step()
        steps.phase("input rounding")
        rounded, line = _input_rounding(low, cand, inj, args)
        steps.step()
        steps.phase("layers")
        out = []
        for rec in records:
            out.append(_entry(rec, low, iso, ref_values, al, inj, rounded))
            steps.step()
        if cand.kind == "ncnn":
            steps.phase("int8 readers' input rounding")
            out = _blame_inputs(out, plan, cand, al, ref_values, inj, steps.step)
        else:
            steps.phase("float parent's names")
            _parent_names(cand, out)
    finally:
        seconds = steps.close()
    ranking = _ranking(out, cand.name, low.precision, line)
    ranking.seconds = seconds
    return ranking


def _records(report: Any, cand: Any) -> list[Any]:
    """The candidate's exactly aligned isolated records."""
    records = [r for r in report.records if r.candidate == cand.name
               and r.mode == "isolated" and r.exact]
    if not records:
        raise InputError(f"{cand.name} has no isolated records to rank",
                         "compare with mode='both' or 'isolated' (the default 'accumulated' "
                         "measures accumulated error only)")
    return records


def _parent_paired(report: Any, cand: Any, records: list[Any], floats: set[str]
                   ) -> tuple[Any, list[Any], dict[str, tuple[str, ...]]]:
    """The candidate's alignment and ``records`` paired as its float parent pairs them
    (``candidates.parent_pairing``, for a quantize artifact; ``floats``: the candidate's
    float tensors): each record takes its tensor's pair and the parent's ``covers``, and
    the ranking's isolated run is fed from those pairs. Also returned: the parent's
    ``covers`` of each tensor it pairs."""
    al, fixed, covers = parent_pairing(report.reference.model, cand,
                                       report.alignments[cand.name], report.inputs, floats)
    return al, [dataclasses.replace(r, reference=fixed.get(r.name, r.reference),
                                    covers=covers[r.name]) if r.name in covers else r
                for r in records], covers


def _unrecorded(report: Any, cand: Any, al: Any, records: list[Any], floats: set[str],
                covers: dict[str, tuple[str, ...]], iso: dict[str, Any],
                ref_values: dict[str, Any]) -> list[Any]:
    """Isolated records, measured on the ranking's isolated run (``iso``), for the float
    tensors ``al`` pairs exactly that have none in ``records``: the rule is that a quantized
    candidate's layer is ranked when its float parent pairs its tensor, whether or not the
    candidate's own values let the comparison pair it (a trained speech detector's int8
    convs are too noisy for the int8 model's own alignment, which attributes them; the fp32
    parent pairs
    them with ``F.relu_0`` .. ``F.relu_3``). A tensor with no value in that run is left out:
    there is nothing to put back."""
    import numpy as np

    from .candidates import candidate_tensors
    from .metrics import Tolerance
    from .record import Record
    from .verdict import measure_pair

    have = {r.name for r in records} | set(cand.runner.input_names)
    todo = {n for n, ref in al.pairs.items() if n in floats and n not in have
            and n in iso and ref in ref_values and al.relation(n).startswith("equal")}
    if not todo:
        return []
    modules = {n for n, _ in report.reference.model.named_modules()}
    tol = report.tolerance or Tolerance()
    out = []
    for t in candidate_tensors(cand, modules):
        if t.name not in todo:
            continue
        value = np.asarray(iso[t.name], dtype=np.float32)
        try:
            ref = reference_of(al, t.name, ref_values, np.shape(value))
        except InputError:
            continue  # its value does not fit the pair: nothing to put back
        m = measure_pair(ref, value, tol)
        if isinstance(m, str):
            continue
        out.append(Record(cand.name, "isolated", t.order, t.name, al.pairs[t.name],
                          t.op_type, m, al.relation(t.name), covers.get(t.name, ()),
                          t.node))
    return out


def _entry(rec: Any, low: Any, iso: dict[str, Any], ref_values: dict[str, Any],
           al: Any, inj: Any, rounded: dict[int, tuple]) -> Sensitivity:
    """One record's Sensitivity: float (not measured), unmeasurable (why), or its cost.

    Its own SNR is measured on the ranking's isolated run (``iso``, fed from ``al``: the
    float parent's pairs), the run its cost is measured on: the comparison's record was
    measured on a run fed from the candidate's own pairs, which may differ upstream (a
    quantized conv paired before its folded BatchNorm made the residual Add reading it
    look like the BatchNorm's error, -1.4 dB, on a trained inverted-residual CNN)."""
    import numpy as np

    from ..precision.snr import snr_db

    own = low.own(rec.name, rec.node)
    iso_snr = rec.metrics.snr_db
    value = iso.get(rec.name)
    if value is not None and rec.name in al.pairs and al.pairs[rec.name] in ref_values:
        try:
            iso_snr = snr_db(reference_of(al, rec.name, ref_values, np.shape(value)),
                             np.asarray(value, dtype=np.float32))
        except InputError:  # it does not fit: the comparison's figure stands
            pass
    if not own.low:
        return Sensitivity(rec, None, iso_snr, status="input" if own.rounding else "float",
                           precision="fp32", reason=own.why)

    def unmeasurable(why: str) -> Sensitivity:
        return Sensitivity(rec, None, iso_snr, status="unmeasurable",
                           precision=low.precision, reason=why)

    if value is None or rec.reference not in ref_values:
        return unmeasurable("its isolated run gave no value for it")
    shape = np.shape(ref_values[rec.reference])
    try:
        replaced = _fit(np.asarray(value, dtype=np.float32), shape)
    except InputError:
        return unmeasurable(f"its value ({list(np.shape(value))}) does not fit "
                            f"{rec.reference}'s shape {list(shape)}")
    args = rounded.get(id(own.holds), inj.args)
    got, why = inj.run(rec.reference, replaced, args)
    if got is None:
        return unmeasurable(why)
    base = inj.plain(args)
    final = min(snr_db(base[n], got[n]) for n in base)
    reason = own.why + (" (measured on the rounded input)" if args is not inj.args else "")
    return Sensitivity(rec, final, iso_snr, precision=low.precision, reason=reason)


def _input_rounding(low: Any, cand: Any, inj: Any, args: tuple
                    ) -> tuple[dict[int, tuple], InputRounding | None]:
    """({id of an InputQuant: the inputs as it rounds them}, the input-rounding line: the
    worst output SNR that rounding alone costs)."""
    import numpy as np
    import torch

    from ..precision.snr import snr_db

    names = list(cand.runner.input_names)
    rounded, worst = {}, None
    for iq in low.inputs:
        if iq.input not in names or names.index(iq.input) >= len(args):
            continue
        i = names.index(iq.input)
        x = args[i]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            continue
        r = torch.from_numpy(iq.apply(x.detach().cpu().numpy())).to(x.dtype)
        rargs = rounded[id(iq)] = (*args[:i], r, *args[i + 1:])
        got = inj.plain(rargs)
        final = min(snr_db(inj.clean[n], got[n]) for n in inj.clean)
        line = InputRounding((iq.input,), iq.readers, final,
                             snr_db(np.asarray(x), r.numpy()))
        if worst is None or final < worst.final_snr_db:
            worst = line
    if worst is not None:
        worst.readers = tuple(dict.fromkeys(r for iq in low.inputs for r in iq.readers))
        worst.inputs = tuple(dict.fromkeys(iq.input for iq in low.inputs
                                           if id(iq) in rounded))
    return rounded, worst


def _ranking(out: list[Sensitivity], name: str, precision: str,
             line: InputRounding | None) -> Ranking:
    """Ranked entries by cost (lowest final SNR first), one per module call (onnxruntime's
    Q/DQ output and the node before it share one), then what is not ranked."""
    ranked = sorted((s for s in out if s.status == "ranked"), key=lambda s: s.final_snr_db)
    seen: set[str] = set()
    ranked = [s for s in ranked if not (s.reference in seen or seen.add(s.reference))]
    unmeasurable = sorted((s for s in out if s.status == "unmeasurable"),
                          key=lambda s: s.isolated_snr_db)
    unmeasurable = [s for s in unmeasurable
                    if not (s.reference in seen or seen.add(s.reference))]
    floats = [s for s in out if s.status == "float"
              and not (s.reference in seen or seen.add(s.reference))]
    return Ranking(ranked, candidate=name, precision=precision, unmeasurable=unmeasurable,
                   floats=floats, input_rounding=line)


def _parent_names(cand: Any, out: list[Sensitivity]) -> None:
    """An ONNX quantize artifact's entries name a node of its float parent
    (``qdq.parent_node``) where the quantized model renamed it (onnxruntime's optimizer fuses
    a MatMul + Add into ``<MatMul>/MatMulAddFusion`` between two new Reshapes): the record's
    ``node`` becomes the parent's, so ``wb.quantize(parent, exclude=rep.sensitive(k))``
    keeps that layer float instead of matching nothing."""
    parent = _float_parent(cand.path)
    if parent is None:
        return
    from ..onnx_io import load_onnx
    from ..precision.qdq import float_name, parent_node

    pg = load_onnx(parent.path, external_data=False).graph
    known = {n.name for n in pg.node} | {o for n in pg.node for o in n.output}
    child = None
    for e in out:
        rec = e.record
        if e.status == "float" or float_name(rec.node or rec.name) in known:
            continue
        child = child or load_onnx(cand.path, external_data=False).graph
        name = parent_node(child, pg, rec.name, rec.node)
        if name is not None:
            e.record = dataclasses.replace(rec, node=name)


def _blame_plan(cand: Any, records: list[Any]) -> list[tuple[str, str, float]]:
    """The int8 layers of an ncnn candidate whose input rounding ``_blame_inputs`` measures:
    (layer, the blob it reads, at the scale the calibration table gives the layer) for each
    int8 layer that wrote a record of ``records`` and reads a blob another record holds (a
    Split's copies read as the blob they copy), in the param's order."""
    from ..params import parse_ncnn_param
    from ..precision.int8_table import read_table

    table_path = cand.path.parent / "model.table"
    if not table_path.is_file():
        return []
    table = read_table(table_path)
    int8 = set(table.blob_scales) - set(table.float_layers)
    layers = parse_ncnn_param(cand.path).layers
    alias = {t: ly.bottoms[0] for ly in layers if ly.type == "Split" for t in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    names = {r.name for r in records}
    nodes = {r.node for r in records if r.node}
    return [(ly.name, root(ly.bottoms[0]), float(table.blob_scales[ly.name][0]))
            for ly in layers if ly.name in int8 and ly.bottoms and ly.name in nodes
            and root(ly.bottoms[0]) in names]


def _blame_inputs(out: list[Sensitivity], plan: list[tuple[str, str, float]], cand: Any,
                  al: Any, ref_values: dict[str, Any], inj: Any, step: Any
                  ) -> list[Sensitivity]:
    """ncnn int8 rounds a blob inside each int8 layer that reads it (at the scale the
    calibration table gives that layer), so a layer's isolated error holds the rounding
    of its input: an outlier channel in the tensor it reads makes it look costly, while the
    tensor's producer looks clean. Each int8 layer's input rounding (``plan``:
    ``_blame_plan``) is measured on its own (the reference tensor rounded at the table's
    scale, put back into the float run; ``step()`` after each layer); when
    it explains the layer's cost (within 3 dB) and the producer ran in int8 too, the cost is
    the producer's: its entry takes the worst of its own, the layer's and the rounding's,
    lists the layer in ``via``, and the layer's entry goes (or keeps only what it is blamed
    for as a producer itself). Keeping the producer in float (``wb.quantize(exclude=...)``)
    keeps its readers float. A float producer (a BatchNorm, a pooling) is never blamed: the
    rounding stays with the int8 layer that does it."""
    ranked = [e for e in out if e.status == "ranked"]
    by_name = {e.record.name: e for e in ranked}
    by_node = {e.record.node: e for e in ranked if e.record.node}
    tried: dict[tuple[str, float], tuple[float | None, float]] = {}
    blamed: list[tuple[Sensitivity, Sensitivity, float, float, str]] = []
    for name, blob, scale in plan:
        reader, producer, ref = by_node.get(name), by_name.get(blob), al.pairs.get(blob)
        if (reader is not None and producer is not None and producer is not reader
                and ref is not None and ref in ref_values):
            if (blob, scale) not in tried:
                tried[(blob, scale)] = _rounding_cost(inj, ref, ref_values[ref], scale)
            final, iso = tried[(blob, scale)]
            if final is not None and reader.final_snr_db is not None \
                    and final <= reader.final_snr_db + 3:
                blamed.append((reader, producer, min(final, reader.final_snr_db), iso, name))
        step()
    # decided on the layers' own figures first: a layer explained by its input loses its
    # own cost (it is its producer's); one also blamed for its output keeps that blame
    readers = {id(r) for r, *_ in blamed}
    for e in out:
        if id(e) in readers:
            e.final_snr_db = None
    for _reader, producer, cost, iso, name in blamed:
        producer.via = (*producer.via, name)
        producer.final_snr_db = cost if producer.final_snr_db is None else min(
            producer.final_snr_db, cost)
        producer.isolated_snr_db = min(producer.isolated_snr_db, iso)
    return [e for e in out if id(e) not in readers or e.via]


def _rounding_cost(inj: Any, ref: str, value: Any, scale: float) -> tuple[float | None, float]:
    """(the output's SNR when only reference tensor ``ref`` is rounded as an ncnn int8 layer
    reading it rounds it, at the table's ``scale``: None when it cannot be put back; the
    rounded tensor's own SNR)."""
    import numpy as np

    from ..precision.lowprec import InputQuant
    from ..precision.snr import snr_db

    v = np.asarray(value, dtype=np.float32)
    q = InputQuant(ref, 1.0 / scale, away=True).apply(v)  # ncnn's scale multiplies
    got, _ = inj.run(ref, q)
    final = None if got is None else min(snr_db(inj.clean[n], got[n]) for n in inj.clean)
    return final, snr_db(v, q)


def _pick(report: Any, candidate: str | None) -> Any:
    """The candidate named, else the one ``_choice`` finds worst."""
    if candidate is not None or len(report.candidates) == 1:
        return report._candidate(candidate)
    worst = _choice(report).worst
    return report._candidate(worst or report.candidates[-1].name)


def _choice(report: Any) -> Choice:
    """The comparison's low-precision candidates (all, when none is) that ran, each with its
    worst output's accumulated SNR (by its own output names: ``output`` of ONNX, ``out0`` of
    ncnn), and the worst of them. An intermediate tensor's SNR does not decide: a residual
    branch's small output is at 0 dB in every int8 model while the outputs differ. When some
    candidate's output was not aligned, each one's worst accumulated tensor decides instead
    (``by`` says which)."""
    cands = [c for c in report.candidates if c.name not in report.failed]
    low = [c for c in cands if c.precision != "fp32"] or cands
    outputs: dict[str, float] = {}
    tensors: dict[str, float] = {}
    for c in low:
        names = set(c.runner.output_names)
        for r in report.records:
            if r.candidate == c.name and r.mode == "accumulated":
                snr = r.metrics.snr_db
                tensors[c.name] = min(tensors.get(c.name, math.inf), snr)
                if r.name in names:
                    outputs[c.name] = min(outputs.get(c.name, math.inf), snr)
    by, figures = ("output", outputs) if len(outputs) == len(tensors) else (
        "worst tensor", tensors)
    worst = min(figures, key=figures.get) if figures else ""
    return Choice(figures, by, worst)
