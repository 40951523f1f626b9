"""The converter's tools on the command line (issue 33): ``prune`` (structured or
unstructured, measured on the backends), ``rewriters`` (what is registered and what would
apply to an export), and export's ``--partition`` (one artifact per part, the chain checked).

Each command imports the engine's stages inside itself, on purpose (``workbench --help``
stays fast; see commands.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InputError
from .common import _artifact, _check_model_path, _json, _model_and_inputs


def cmd_prune(args: argparse.Namespace) -> int:
    """Prune MODEL's copy and print the report: each figure before and after, the notes.
    Exit 1 when a backend could not be measured (its error in the notes)."""
    from ..stages.prune import prune

    model, inputs = _model_and_inputs(args.model, args.input, args.dtype)
    backends = () if args.backends.strip().lower() in ("", "none") else tuple(
        b.strip() for b in args.backends.split(",") if b.strip())
    res = prune(model, args.amount, args.method, example_inputs=inputs,
                ignored_layers=args.ignore or (), round_to=args.round_to, backends=backends,
                workspace=args.out, threads=args.threads, repeat=args.repeat,
                progress=not args.json)
    rep = res.report
    ok = not rep.errors
    if args.json:
        _json({"ok": ok, "summary": rep.summary(), "method": rep.method, "amount": rep.amount,
               "weights_pruned": rep.weights_pruned, "round_to": rep.round_to,
               "figures": rep.table(), "snr_db": rep.snr_db, "max_abs": rep.max_abs,
               "notes": rep.notes(),
               "artifacts": {k: _artifact(a) for k, a in rep.artifacts.items()}})
        return 0 if ok else 1
    print(rep.text())
    if args.save:
        import torch

        torch.save(res.model, args.save)
        print(f"pruned model: {args.save} (torch.save of the module; torch.load(..., "
              "weights_only=False) reads it)")
    return 0 if ok else 1


def round_to(text: str) -> int | None:
    """--round-to 8 -> 8; none (exact widths) -> None."""
    if text.strip().lower() in ("none", "exact", "0"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--round-to {text!r}: expected a number of "
                                         "channels (e.g. 8) or none") from None


def cmd_rewriters(args: argparse.Namespace) -> int:
    """Every registered rewriter (the shipped ones, those a MODEL's module registers when
    imported, register_symbolic's) with its conditions, and whether it applies to the
    export --backend/--exporter/--opset describe."""
    from ..stages.rewriters import RewriteContext, rewriters
    from ..stages.rewriters_builtin import SHIPPED

    if args.model:  # its module's decorators register the user's rewriters
        from ..sweeps.factory import resolve

        _check_model_path(args.model)
        resolve(args.model)
    ctx = RewriteContext("export", args.backend, args.exporter, args.opset)
    found = rewriters()
    rows = [{"name": r.name, "kind": r.kind, "target": r.target, **r.conditions(),
             "shipped": r.builtin, "applies": r.matches(ctx), "off": False} for r in found]
    names = {r.name for r in found}
    rows += [{"name": s.name, "kind": "function", "target": s.target, "backend": s.backend,
              "exporter": s.exporter, "opset": None, "shipped": True, "applies": False,
              "off": True} for s in SHIPPED if s.name not in names]
    if args.json:
        _json({"ok": True, "export": {"backend": args.backend, "exporter": args.exporter,
                                      "opset": args.opset}, "rewriters": rows})
        return 0
    print(f"rewriters for an export to {args.backend} ({args.exporter}, opset {args.opset}):")
    for r in rows:
        when = ", ".join(f"{k}={r[k]}" for k in ("backend", "exporter", "opset") if r[k])
        state = "off" if r["off"] else "applies" if r["applies"] else "not here"
        print(f"  {state:8}  {r['name']}  {r['kind']} {r['target']}"
              + (f"  [{when}]" if when else "") + ("  (shipped)" if r["shipped"] else "")
              + (f"  wb.enable_rewriter({r['name']!r}) turns it on" if r["off"] else ""))
    return 0


def export_partition(args: argparse.Namespace, model: Any, inputs: tuple) -> int:
    """export --partition: the parts for --backend, the chain checked against the model
    (exit 1 when a chain or part is past tolerance, or no part took the backend)."""
    from ..comparison.parts import compare_parts
    from ..stages.partition import partition

    cuts = [[n.strip() for n in cut.split("+") if n.strip()]
            for cut in args.partition.split(",") if cut.strip()]
    if not cuts:
        raise InputError(f"--partition {args.partition!r}: no cut named",
                         "e.g. --partition backbone_out (a wb.mark name or a submodule "
                         "name); several cuts comma-separated, a cut of several tensors "
                         "joined by +")
    parts = partition(model, inputs, at=cuts, workspace=args.out, backends=(args.backend,),
                      exporter=args.exporter, opset=args.opset)
    rep = compare_parts(model, parts, inputs)
    took = any(p.artifacts for p in parts.parts)
    ok = rep.ok and took
    if args.json:
        _json({"ok": ok, "cuts": parts.cuts, "parts": [_part(p) for p in parts.parts],
               "checks": rep.table(), "summary": rep.summary()})
        return 0 if ok else 1
    print(parts.summary())
    print(rep.summary())
    if not took:
        print(f"no part runs on {args.backend}: every part stays in torch")
    return 0 if ok else 1


def _part(p: Any) -> dict[str, Any]:
    return {"name": p.name, "inputs": p.inputs, "outputs": p.outputs,
            "artifacts": {b: _artifact(a) for b, a in p.artifacts.items()},
            "in_torch": p.in_torch}
