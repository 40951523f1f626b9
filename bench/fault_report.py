"""What ``bench/faults.py`` prints for one model set at one strength: the table per candidate
kind, the misses, the invisible and not-run trials, the clean comparisons, where the weights
were found, and the targets as PASS/FAIL lines; and the side-by-side table that ends a run of
several sets or strengths.

Targets (issue 16; issue 36 holds the default, hf and trained sets to them, at strength 1
and 3): localisation >= 98% on every kind; 0 false alarms on clean comparisons; every tensor
aligned or attributed; aligned fraction >= 0.95 on every candidate. The misses are listed
with model, module, what was named instead and the figures, and a guessed cause.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

import fault_visibility as visibility
from _common import print_figures, print_table
from fault_records import NO_WEIGHT, NOT_RUN, RUN_FAILED, UNBUILT, Clean, Trial, counted

LOCALISATION, ALIGNED = 0.98, 0.95


def fmt_named(n: dict[str, Any] | None) -> str:
    if not n:
        return "nothing"
    cov = f", covers {n['covers']}" if n.get("covers") else ""
    rel = f", {n['relation']}" if n.get("relation") not in (None, "equal") else ""
    # tolerance is the whole-tensor bound (atol + rtol * max |ref|); an element fails on
    # its own atol + rtol * |ref|: "needs atol" is the atol that would pass them all
    return (f"{n['reference']} ({n['op_type']} {n['tensor']}, {n['mode']} max abs "
            f"{n['max_abs']:.3g}, {100 * n['frac_over_tol']:.2g}% of elements over tol, "
            f"needs atol {n['min_tol']:.3g}{cov}{rel})")


def report(trials: list[Trial], cleans: list[Clean], kinds: list[str], mode: str,
           title: str = "", clean_details: bool = True) -> None:
    """One model set at one strength: the table per candidate kind, the misses, the
    invisible trials, and the targets as PASS/FAIL lines; the clean comparisons' details
    unless ``clean_details`` is False (a second strength of the same set: they are the same
    comparisons)."""
    table = [("kind", "hits / trials", "localised", "acc. verdict", "not run", "invisible",
              "false alarms / clean", "aligned min", "aligned median", "unexplained tensors",
              "offsets verified")]
    rows: list[tuple[str, float | None, str, bool]] = []
    for kind in kinds:
        line, mine = kind_figures(trials, cleans, kind, mode)
        table.append(line)
        rows += mine
    print()
    if title:
        print(f"== {title} ==")
    print(f"fault localisation (compare mode={mode!r}; a hit: first_divergence names the "
          "perturbed module or covers it)")
    print_table(table)
    print_misses([t for t in trials if not t.hit and counted(t)])
    visibility.print_invisible(trials)
    print_not_run(trials)
    if clean_details:
        clean_sections(cleans)
    else:
        print(f"\nclean comparisons: as listed above for this set ({sum(c.false_alarm for c in cleans)}"
              " false alarms)")
    print("\nwhere the weights were found (relation to the torch weight):")
    for kind in kinds:
        rel = Counter(t.relation for t in trials if t.kind == kind and t.relation)
        print(f"  {kind}: " + ("; ".join(f"{n}x {r}" for r, n in rel.most_common()) or "-"))
    subs = [t for t in trials if t.substitute_for]
    if subs:
        print(f"\nweights not found in the candidate (folded, or where the bench does not look: "
              f"graph initializers and graph-level Constants only, not a raised function's "
              f"body), another module taken ({len(subs)}):")
        for t in subs:
            print(f"  {t.model} / {t.kind}: {t.substitute_for} -> {t.module}")
    print()
    print_targets(rows, title)


def kind_figures(trials: list[Trial], cleans: list[Clean], kind: str, mode: str
                 ) -> tuple[tuple[str, ...], list[tuple[str, float | None, str, bool]]]:
    """One kind's table line and its target rows (label, value, shown, met)."""
    unbuilt = [t for t in trials if t.kind == kind and t.cause in NOT_RUN]
    unseen = [t for t in trials if t.kind == kind and t.cause == visibility.INVISIBLE]
    ts = [t for t in trials if t.kind == kind and counted(t)]
    scored = [t for t in ts if not t.error]
    hits = sum(t.hit for t in ts)
    acc = sum(t.hit_accumulated for t in scored)
    cs = [c for c in cleans if c.kind == kind and c.error != "no candidate" and not c.failed]
    alarms = sum(c.false_alarm for c in cs)
    # past a true deviation the candidate's values match nothing: not an alignment gap
    fr = [c.figures["aligned_fraction"] for c in cs if c.figures and not c.deviates]
    unexpl = sum(c.figures.get("unexplained", 0) for c in cs if c.figures and not c.deviates)
    with_unexpl = sum(1 for c in cs if c.figures.get("unexplained") and not c.deviates)
    ver = sum(t.verified == "yes" for t in scored)
    loc = hits / len(ts) if ts else None
    line = (kind, f"{hits}/{len(ts)}", f"{100 * loc:.1f}%" if loc is not None else "-",
            f"{acc}/{len(scored)}" if mode != "isolated" else "-", str(len(unbuilt)),
            str(len(unseen)), f"{alarms}/{len(cs)}", f"{min(fr):.3f}" if fr else "-",
            f"{statistics.median(fr):.3f}" if fr else "-",
            f"{unexpl} in {with_unexpl}/{len(fr)}", f"{ver}/{len(scored)}")
    rows = [(f"localisation {kind} >= {100 * LOCALISATION:.0f}%", loc, f"{hits}/{len(ts)}",
             loc is not None and loc >= LOCALISATION),
            (f"false alarms {kind} = 0", float(alarms) if cs else None, f"{alarms}/{len(cs)}",
             alarms == 0),
            (f"aligned min {kind} >= {ALIGNED}", min(fr) if fr else None,
             f"{min(fr):.3f}" if fr else "-", bool(fr) and round(min(fr), 3) >= ALIGNED),
            (f"every tensor aligned or attributed ({kind})", float(unexpl) if fr else None,
             f"{unexpl} unexplained", bool(fr) and unexpl == 0)]
    return line, rows


def print_misses(misses: list[Trial]) -> None:
    """Each miss with what was named instead, its figures and a guessed cause."""
    print(f"\nmisses ({len(misses)}):")
    for t in misses:
        sub = f" (for {t.substitute_for}, not found)" if t.substitute_for else ""
        own = "; ".join(f"{o['mode']} {o['tensor']} max abs {o['max_abs']:.3g} "
                        f"{'passed' if o['passed'] else 'FAILED'}" for o in t.own[:3]) or "none"
        print(f"  {t.model} / {t.kind}: {t.module or '-'} [{t.module_type}]{sub}")
        if t.error:
            print(f"      error: {t.error}")
        else:
            print(f"      named: {fmt_named(t.named)}")
            if t.named_accumulated and t.named_accumulated != t.named:
                print(f"      accumulated verdict: {fmt_named(t.named_accumulated)}")
            if t.source:
                print(f"      error source named (not a divergence): {fmt_named(t.source)}"
                      f" ({'the perturbed module' if t.source_blames else 'another module'})")
            print(f"      weight: {t.store} ({t.relation}, {t.edited} values edited"
                  f"{f', byte {t.offset}' if t.offset >= 0 else ''}); edit verified: "
                  f"{t.verified}; torch effect {t.torch_effect:.3g}x tolerance")
            print(f"      the module's own records: {own}")
            print(f"      the {t.reader_op} reading the weight: {t.reader}; clean: "
                  f"{t.reader_clean}")
            print(f"      the fault's largest effect on the candidate: {t.effect}")
        print(f"      cause: {t.cause}")
    sourced = [t for t in misses if t.source_blames]
    if misses:
        print(f"\nmisses whose error source wb.compare names at the perturbed module "
              f"(CompareReport.error_sources, no divergence): {len(sourced)}/{len(misses)}")
    causes = Counter(re.sub(r"named \S+", "named …", t.cause) for t in misses)
    if causes:
        print("\nmisses by cause:")
        for c, n in causes.most_common():
            print(f"  {n:3d}  {c}")


def print_not_run(trials: list[Trial]) -> None:
    """Trials not run: no candidate built, or no weight of the model found in it."""
    unbuilt = Counter(f"{t.model} / {t.kind}" for t in trials if t.cause == UNBUILT)
    if unbuilt:
        print(f"\nnot run, the candidate could not be built (see the notes above; not counted "
              f"in hits / trials): {', '.join(f'{k} ({n} trials)' for k, n in unbuilt.items())}")
    unweighted = Counter(f"{t.model} / {t.kind}" for t in trials if t.cause == NO_WEIGHT)
    if unweighted:
        print(f"\nnot run, {NO_WEIGHT} (computed in forward, folded: no fault to put in; not "
              f"counted): {', '.join(f'{k} ({n} trials)' for k, n in unweighted.items())}")


def print_targets(rows: list[tuple[str, float | None, str, bool]], title: str) -> None:
    """The target rows as PASS/FAIL figures, then one line per target."""
    fig = [("target", "measured", "result")]
    passed, failed = [], []
    for label, value, shown, ok in rows:
        if value is None:
            fig.append((label, "-", "n/a"))
            continue
        (passed if ok else failed).append(label)
        fig.append((label, shown, "PASS" if ok else "FAIL"))
    print_figures(fig, passed, failed, [r[0] for r in rows if r[1] is None])
    for target, key in (("localisation >= 98% on every candidate kind", "localisation"),
                       ("0 false alarms on clean comparisons", "false alarms"),
                       (f"aligned >= {ALIGNED} on every candidate", "aligned min"),
                       ("every tensor aligned or attributed", "every tensor")):
        mine = [r for r in rows if r[0].startswith(key)]
        met = all(r[3] for r in mine) and all(r[1] is not None for r in mine)
        print(f"target {target}: {'met' if met else 'not met'}"
              + (f" ({title})" if title else ""))


def clean_sections(cleans: list[Clean]) -> None:
    """The clean comparisons that failed to run, truly deviate, raised an alarm, or left
    tensors unaligned."""
    failed = [c for c in cleans if c.failed]
    if failed:
        print(f"\nclean candidates whose run failed ({len(failed)}; wb.compare reports them "
              "not ok, rightly: not false alarms; their trials not counted):")
        for c in failed:
            print(f"  {c.model} / {c.kind}: {RUN_FAILED}: {c.failed}")
    explained = [c for c in cleans if c.explained]
    if explained:
        print(f"\nclean candidates that truly deviate, the cause named by wb.compare "
              f"({len(explained)}; not false alarms):")
        for c in explained:
            print(f"  {c.model} / {c.kind}: {fmt_named(c.named)}\n      note: {c.explained}"
                  + ("\n      its trials not counted (the candidate already deviates)"
                     if c.deviates else ""))
    alarms = [c for c in cleans if c.false_alarm]
    print(f"\nfalse alarms on clean comparisons ({len(alarms)}):")
    for c in alarms:
        print(f"  {c.model} / {c.kind}: {c.error or fmt_named(c.named)}"
              f"{'' if c.ok or c.error else ' (rep.ok False)'}")
        if c.summary:
            print(f"      summary: {c.summary}")
    low = [c for c in cleans if c.figures and not c.deviates and (
        c.figures["aligned_fraction"] < ALIGNED or c.figures["unexplained"])]
    print(f"\ncandidates with aligned < {ALIGNED} or tensors unexplained ({len(low)}):")
    for c in low:
        f = c.figures
        print(f"  {c.model} / {c.kind}: aligned {f['aligned_fraction']:.3f} ({f['pairs']}/"
              f"{f['considered']}, {f['attributed']} attributed, {f['unexplained']} "
              f"unexplained): {'; '.join(f'{n}x {r}' for r, n in f['unaligned_reasons'].items())}")


def side_by_side(trials: list[Trial], cleans: list[Clean], kinds: list[str],
                 sets: dict[str, list[str]], strengths: tuple[float, ...]) -> None:
    """Localised k/n per set, kind and strength in one table, with the clean false alarms."""
    table = [("set", "kind", *(f"localised {k:g}x" for k in strengths), "false alarms / clean")]
    for set_name, names in sets.items():
        for kind in kinds:
            cells = []
            for k in strengths:
                at = [t for t in trials if t.model in names and t.kind == kind
                      and t.strength == k]
                ts = [t for t in at if counted(t)]
                hits = sum(t.hit for t in ts)
                unseen = sum(t.cause == visibility.INVISIBLE for t in at)
                cells.append((f"{hits}/{len(ts)} ({100 * hits / len(ts):.1f}%)" if ts else "-")
                             + (f" +{unseen} invisible" if unseen else ""))
            cs = [c for c in cleans if c.model in names and c.kind == kind
                  and c.error != "no candidate" and not c.failed]
            table.append((set_name, kind, *cells,
                          f"{sum(c.false_alarm for c in cs)}/{len(cs)}"))
    print("\nside by side (targets: localised >= 98% on every kind, 0 false alarms; "
          "invisible trials, on no tensor beyond tolerance, not counted)")
    print_table(table)
