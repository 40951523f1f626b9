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
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .candidates import copies as _copies
from .candidates import float_parent as _float_parent
from .candidates import parent_pairing
from .isolated import fit_reference as _fit
from .isolated import isolated as _isolated
from .isolated import reference_of
from .schedule import torch_threads

STATUSES = ("ranked", "unmeasurable", "float")


@dataclass
class Sensitivity:
    """One layer's cost: ``final_snr_db`` is the model output's SNR (the worst output) when
    only this layer's isolated error is let into a float run (None: not measured);
    ``isolated_snr_db`` the layer's own SNR on reference inputs; ``status`` "ranked" (ran in
    low precision, measured), "unmeasurable" (ran in low precision, its value cannot be put
    back into the torch run: ``reason`` says why) or "float" (ran in fp32: not ranked);
    ``precision`` what its own computation ran in (int8, fp16, bf16, fp32); ``reason`` what
    ran, or why it is not measured."""

    record: Any  # the isolated Record (``.reference`` is the module call)
    final_snr_db: float | None
    isolated_snr_db: float
    # ncnn int8: the layers whose rounding of this record's tensor (ncnn rounds a blob
    # inside each int8 layer that reads it) is counted here rather than against them
    via: tuple[str, ...] = ()
    status: str = "ranked"
    precision: str = "int8"
    reason: str = ""

    @property
    def reference(self) -> str:
        return self.record.reference


@dataclass
class InputRounding:
    """The loss of the model input rounded to low precision by the layers that read it:
    ``final_snr_db`` (the output's SNR when only the input is rounded), ``isolated_snr_db``
    (the rounded input's own SNR), ``inputs`` and ``readers`` by the candidate's names."""

    inputs: tuple[str, ...]
    readers: tuple[str, ...]
    final_snr_db: float
    isolated_snr_db: float

    def line(self) -> str:
        readers = ", ".join(self.readers[:4]) + (" ..." if len(self.readers) > 4 else "")
        return (f"input rounding: {self.final_snr_db:.1f} dB (input {', '.join(self.inputs)} "
                f"rounded to int8 by {readers}, {self.isolated_snr_db:.1f} dB on its own; no "
                "layer's error, so no layer is ranked for it)")


class Ranking(list):
    """The measured low-precision layers, most costly first (a list of Sensitivity:
    ``rep.sensitive(k)`` takes the first k), with what is not ranked beside it:
    ``unmeasurable`` and ``floats`` (Sensitivity entries with the reason), and
    ``input_rounding`` (None when the model input is not rounded). ``summary()`` says it
    all in lines."""

    def __init__(self, ranked: list[Sensitivity] = (), *, candidate: str = "",
                 precision: str = "", unmeasurable: list[Sensitivity] = (),
                 floats: list[Sensitivity] = (), input_rounding: InputRounding | None = None
                 ) -> None:
        super().__init__(ranked)
        self.candidate, self.precision = candidate, precision
        self.unmeasurable, self.floats = list(unmeasurable), list(floats)
        self.input_rounding = input_rounding

    def summary(self, top: int = 10) -> str:
        """The ranking in lines: the top layers, the input rounding, what is not ranked."""
        out = [f"{self.candidate}: {len(self)} {self.precision} layers ranked by what their "
               "own error costs the output (final-output SNR, most costly first)"]
        for i, s in enumerate(self[:top], 1):
            via = f", via {', '.join(s.via)}" if s.via else ""
            out.append(f"  {i}. {s.reference} [{s.record.node or s.record.name}{via}]: "
                       f"{s.final_snr_db:.1f} dB (own {s.isolated_snr_db:.1f} dB)")
        if self.input_rounding is not None:
            out.append(self.input_rounding.line())
        for s in self.unmeasurable:
            out.append(f"unmeasurable: {s.reference} [{s.record.node or s.record.name}] "
                       f"(own {s.isolated_snr_db:.1f} dB): {s.reason}")
        if self.floats:
            names = ", ".join(f"{s.reference} [{s.record.node}]" for s in self.floats[:8])
            out.append(f"float, not ranked: {len(self.floats)} layers ran in fp32: {names}"
                       + (" ..." if len(self.floats) > 8 else ""))
        return "\n".join(out)


def sensitivity(report: Any, candidate: str | None = None, progress: bool = True
                ) -> Ranking:
    """The layers of ``candidate`` (default: the candidate whose outputs are furthest from
    the reference) that ran in low precision, most costly first, with the float,
    unmeasurable and input-rounding lines beside them (``Ranking``)."""
    from ..runtime import TorchRunner

    ref_runner = report.reference
    if not isinstance(ref_runner, TorchRunner):
        raise InputError("sensitivity puts layer outputs back into the PyTorch model; this "
                         f"comparison's reference is a {type(ref_runner).__name__}",
                         "compare against the nn.Module: wb.compare(model, [...], inputs)")
    cand = _pick(report, candidate)
    with torch_threads(1):  # as the comparison's own torch runs (schedule.py)
        return _rank(report, cand, ref_runner, progress)


def _rank(report: Any, cand: Any, ref_runner: Any, progress: bool) -> Ranking:
    """sensitivity()'s work, on checked arguments."""
    import numpy as np
    from tqdm.auto import tqdm

    from ..precision.lowprec import lowering
    from .inject import TorchInjector

    records = _records(report, cand)
    args = report.inputs
    ref_values = ref_runner.run(_copies(args), capture="all")
    values = cand.runner.run(_copies(args), capture="all")
    layout = {n: (np.shape(v), np.asarray(v).dtype) for n, v in values.items()}
    values = None
    floats = {n for n, (_, dtype) in layout.items() if dtype.kind == "f"}
    al, records, covers = _parent_paired(report, cand, records, floats)
    iso = _isolated(cand, al, ref_values, layout, _copies(args)) or {}
    records += _unrecorded(report, cand, al, records, floats, covers, iso, ref_values)
    cut = set(al.pairs) if cand.kind == "ncnn" else set(al.pairs) & set(layout)
    low = lowering(cand.path, cand.kind, cand.precision, cut)
    inj = TorchInjector(ref_runner, args)
    rounded, line = _input_rounding(low, cand, inj, args)
    out = []
    for rec in tqdm(records, desc="sensitivity", disable=not progress, leave=False):
        out.append(_entry(rec, low, iso, ref_values, al, inj, rounded))
    if cand.kind == "ncnn":
        out = _blame_inputs(out, cand, al, ref_values, inj)
    else:
        _parent_names(cand, out)
    return _ranking(out, cand.name, low.precision, line)


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


def _blame_inputs(out: list[Sensitivity], cand: Any, al: Any, ref_values: dict[str, Any],
                  inj: Any) -> list[Sensitivity]:
    """ncnn int8 rounds a blob inside each int8 layer that reads it (at the scale the
    calibration table gives that layer), so a layer's isolated error holds the rounding
    of its input: an outlier channel in the tensor it reads makes it look costly, while the
    tensor's producer looks clean. Each int8 layer's input rounding is measured on its own
    (the reference tensor rounded at the table's scale, put back into the float run); when
    it explains the layer's cost (within 3 dB) and the producer ran in int8 too, the cost is
    the producer's: its entry takes the worst of its own, the layer's and the rounding's,
    lists the layer in ``via``, and the layer's entry goes (or keeps only what it is blamed
    for as a producer itself). Keeping the producer in float (``wb.quantize(exclude=...)``)
    keeps its readers float. A float producer (a BatchNorm, a pooling) is never blamed: the
    rounding stays with the int8 layer that does it."""
    from ..params import parse_ncnn_param
    from ..precision.int8_table import read_table

    table_path = cand.path.parent / "model.table"
    if not table_path.is_file():
        return out
    table = read_table(table_path)
    int8 = set(table.blob_scales) - set(table.float_layers)
    layers = parse_ncnn_param(cand.path).layers
    alias = {t: ly.bottoms[0] for ly in layers if ly.type == "Split" for t in ly.tops}

    def root(blob: str) -> str:
        while blob in alias:
            blob = alias[blob]
        return blob

    ranked = [e for e in out if e.status == "ranked"]
    by_name = {e.record.name: e for e in ranked}
    by_node = {e.record.node: e for e in ranked if e.record.node}
    tried: dict[tuple[str, float], tuple[float | None, float]] = {}
    blamed: list[tuple[Sensitivity, Sensitivity, float, float, str]] = []
    for ly in layers:
        if ly.name not in int8 or not ly.bottoms or ly.name not in by_node:
            continue
        reader = by_node[ly.name]
        blob = root(ly.bottoms[0])
        producer = by_name.get(blob)
        ref = al.pairs.get(blob)
        if producer is None or producer is reader or ref is None or ref not in ref_values:
            continue
        scale = float(table.blob_scales[ly.name][0])
        if (blob, scale) not in tried:
            tried[(blob, scale)] = _rounding_cost(inj, ref, ref_values[ref], scale)
        final, iso = tried[(blob, scale)]
        if final is None or reader.final_snr_db is None or final > reader.final_snr_db + 3:
            continue
        blamed.append((reader, producer, min(final, reader.final_snr_db), iso, ly.name))
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
    if candidate is not None or len(report.candidates) == 1:
        return report._candidate(candidate)
    worst: dict[str, float] = {}
    for r in report.records:
        if r.mode == "accumulated":
            snr = r.metrics.snr_db
            worst[r.candidate] = min(worst.get(r.candidate, math.inf), snr)
    name = min(worst, key=worst.get) if worst else report.candidates[-1].name
    return report._candidate(name)
