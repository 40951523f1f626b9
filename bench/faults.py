"""Does ``wb.compare`` blame an injected fault on the right layer, and stay quiet on a clean one?

Models (``bench/fault_sets.py``): the default model (``wb.default_model()``), the zoo
(``workbench.zoo.ZOO``: transformers architectures, small configs, seeded) and the
architectures it lacks (``bench/fault_models.py``: LSTM/GRU sequence model, UNet, YOLO-style
backbone, depthwise-separable net with squeeze-excite, causal decoder). Nothing is downloaded.

Each model, in turn (``bench/fault_run.py``):

- its candidates are built once in a temporary workspace (``bench/fault_candidates.py``):
  ``export`` (TorchScript, opset 17), ``simplify`` (onnxslim), ``raise`` and ``ncnn`` (fp32
  weights); opt-in, ``--kinds dynamo``;
- each candidate is compared clean with torch: a false alarm is a first divergence, or
  ``rep.ok`` False (``bench/fault_verdict.py``);
- a fault: one weight of a module picked at evenly spaced depths of the model's weighted
  modules in execution order (``--depths``, ``--quick`` one in the middle), Gaussian noise on
  a quarter of its values, put *into the candidate*, not the torch reference; ``--damage``
  ``relative`` (each value times 1 + 0.1·K·N(0, 1), the bench's since issue 16) or ``max``
  (each value plus 0.1·K·max|w|·N(0, 1), issue 36's, on trained weights), ``--strength K``
  (``bench/fault_damage.py``);
- the weight is found in the candidate by value (ONNX initializers; the ``.ncnn.bin`` walked
  layer by layer from the ``.ncnn.param``: ``bench/fault_locate.py``), edited in a copy, and
  the edit verified: the first node/layer whose output changes must be the one that reads
  the edited weight (``bench/fault_edit.py``); a module whose weight cannot be found is
  replaced by the nearest one that can, and said so;
- ``rep = wb.compare(model, [candidate], inputs, mode=...)`` (default ``both``). A hit:
  ``rep.first_divergence`` names the perturbed module or a fused op whose record ``covers``
  it; the accumulated-mode verdict is scored beside it (``bench/fault_trial.py``).

A trial not blamed on its module is a miss, with a guessed cause (``bench/fault_causes.py``),
unless the fault is *invisible on its candidate* (``bench/fault_visibility.py``): it moves no
tensor the candidate computes beyond the bound its verdict uses, the comparison named nothing
in either mode, and the edit was verified. Invisible trials are counted and printed on their
own, each with its largest effect, and left out of hits / trials.

Targets (issue 16; issue 36 holds the default, hf and trained sets to them, at strength 1
and 3): localisation >= 98% on every kind; 0 false alarms on clean comparisons; every tensor
aligned or attributed; aligned fraction >= 0.95 on every candidate (``bench/fault_report.py``
prints them). The misses are listed with model, module, what was named instead and the
figures, and a guessed cause. It is a report, not a test: the exit status is 0 whatever the
figures say.

``--models trained`` runs the trained zoo (``bench/fault_trained.py``: ``workbench.trained``'s
MobileNetV2, CREPE tiny, silero-vad, MiniLM, real weights and real inputs; issue 36's set).
``--models hf`` runs the opt-in set of ``bench/hf_models.py`` instead (37 transformers
architectures beyond the zoo, listed in ``bench/fault_sets.py``): where new wrong verdicts
are looked for. Sets can be combined (``--models trained,hf``); each set and strength gets its
own summary, with its targets as PASS/FAIL lines, and a side-by-side table ends the run.

Run:  cd /work/main && .venv/bin/python bench/faults.py [--models a,b|hf|trained]
          [--kinds export,ncnn] [--quick] [--depths N] [--strength 1,3]
          [--damage auto|relative|max] [--mode both|accumulated|isolated] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import engine_state  # bench/ is on sys.path
from fault_candidates import EXTRA_KINDS, KINDS
from fault_damage import DAMAGES, FRACTION, NOISE
from fault_records import Clean, Trial, first_line
from fault_report import report, side_by_side
from fault_run import run_model
from fault_sets import model_sets, set_damage
from tqdm import tqdm


@dataclass
class Plan:
    """What the command line asks for, checked."""

    names: list[str]  # the models, in order
    kinds: list[str]
    strengths: tuple[float, ...]
    depths: int
    factories: dict[str, Any]  # by model name
    set_of: dict[str, str]  # each model's set
    by_set: dict[str, list[str]]  # the models asked for, by set


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", help="comma-separated model names or sets (default: the "
                   "default set); hf: the opt-in transformers set; trained: the trained "
                   "zoo (bench/fault_trained.py)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated candidate kinds (default {','.join(KINDS)})")
    p.add_argument("--quick", action="store_true", help="one depth (the middle)")
    p.add_argument("--depths", type=int, default=5, help="depths per model (default 5)")
    p.add_argument("--strength", default="1",
                   help="comma-separated multiples K of the damage (default 1: the "
                   "current strength, noise of 10%% -- of each value (relative) or of "
                   "the weight's max |w| (max) -- on a quarter of one weight's values); "
                   "'1,3' runs both on the same candidates")
    p.add_argument("--damage", default="auto", choices=("auto", *DAMAGES),
                   help="relative: each value times 1 + 0.1*K*N(0,1) (the bench's since "
                   "issue 16); max: each value plus 0.1*K*max|w|*N(0,1) (issue 36's "
                   "damage on trained weights); auto (default): max on the trained set, "
                   "relative on the others")
    p.add_argument("--mode", default="both", choices=("accumulated", "isolated", "both"))
    p.add_argument("--json", help="write every trial and clean comparison here")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failed trials")
    return p


def plan(args: argparse.Namespace, p: argparse.ArgumentParser) -> Plan:
    """The models, kinds and strengths asked for; an unknown one is a usage error."""
    sets = model_sets()
    factories = {n: f for members in sets.values() for n, f in members.items()}
    set_of = {n: s for s, members in sets.items() for n in members}
    asked = args.models.split(",") if args.models else list(sets["default"])
    names = list(dict.fromkeys(m for n in asked for m in (
        list(sets[n]) if n in ("hf", "trained") else [n])))
    unknown = [n for n in names if n not in factories]
    kinds = args.kinds.split(",")
    bad_kinds = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
    try:
        strengths = tuple(dict.fromkeys(float(k) for k in args.strength.split(",")))
    except ValueError:
        strengths = ()
    if unknown or bad_kinds or not strengths or min(strengths) <= 0:
        p.error(f"unknown models {unknown} or kinds {bad_kinds}, or strengths "
                f"{args.strength!r} not positive numbers; models: {', '.join(factories)}; "
                f"sets: hf, trained; kinds: {', '.join(KINDS + EXTRA_KINDS)}")
    by_set: dict[str, list[str]] = {}
    for n in names:
        by_set.setdefault(set_of[n], []).append(n)
    depths = 1 if args.quick else max(1, args.depths)
    return Plan(names, kinds, strengths, depths, factories, set_of, by_set)


def run_all(pl: Plan, args: argparse.Namespace, trials: list[Trial], cleans: list[Clean],
            notes: list[str]) -> None:
    """Every model asked for, one after the other, in one temporary folder; what each
    gives is added to ``trials``, ``cleans`` and ``notes`` as it comes."""
    with tempfile.TemporaryDirectory(prefix="wb-bench-faults-") as tmp:
        bar = tqdm(total=len(pl.names) * len(pl.kinds) * (pl.depths * len(pl.strengths) + 1),
                   desc="faults", file=sys.stderr)
        for name in pl.names:
            bar.set_postfix_str(name)
            t0 = time.perf_counter()
            try:
                t, c = run_model(name, pl.factories[name], pl.kinds, pl.depths, args.mode,
                                 Path(tmp), bar, notes,
                                 set_damage(pl.set_of[name], args.damage), pl.strengths)
                trials += t
                cleans += c
            except Exception as e:
                notes.append(f"{name}: failed: {type(e).__name__}: {first_line(e)}")
                traceback.print_exc()
            notes.append(f"{name}: {time.perf_counter() - t0:.1f} s")
        bar.close()


def print_run(pl: Plan, args: argparse.Namespace, trials: list[Trial], cleans: list[Clean],
              notes: list[str], t_start: float) -> None:
    """The notes, the run's line, one report per set and strength, and the side-by-side
    table when there are several."""
    for n in notes:
        print(n)
    damages = "; ".join(f"{s}: {set_damage(s, args.damage)}" for s in pl.by_set)
    print(f"whole run {time.perf_counter() - t_start:.0f} s; models: {', '.join(pl.names)}; "
          f"depths per model: {pl.depths}; noise {100 * NOISE:.0f}% x strength "
          f"{', '.join(f'{k:g}' for k in pl.strengths)} on {100 * FRACTION:.0f}% of one "
          f"weight; damage by set: {damages}; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for set_name, members in pl.by_set.items():
        damage = set_damage(set_name, args.damage)
        cs = [c for c in cleans if c.model in members]
        for i, k in enumerate(pl.strengths):
            ts = [t for t in trials if t.model in members and t.strength == k]
            report(ts, cs, pl.kinds, args.mode,
                   f"model set {set_name} ({len(members)} models), damage {damage}, "
                   f"strength {k:g}x", clean_details=i == 0)
    if len(pl.by_set) > 1 or len(pl.strengths) > 1:
        side_by_side(trials, cleans, pl.kinds, pl.by_set, pl.strengths)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    pl = plan(args, p)
    t_start = time.perf_counter()
    trials: list[Trial] = []
    cleans: list[Clean] = []
    notes: list[str] = []
    print(engine_state(), flush=True)
    try:
        run_all(pl, args, trials, cleans, notes)
        print_run(pl, args, trials, cleans, notes, t_start)
    except Exception:
        traceback.print_exc()
        print("summary: the benchmark could not finish (traceback above)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"trials": [asdict(t) for t in trials], "clean": [asdict(c) for c in cleans],
             "notes": notes}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
