"""Issue 17's fault corpus: every generated case in a child process of its own, classified.

    .venv/bin/python bench/corpus.py [--family F] [--limit N] [--json OUT] [--seed S]

Prints the counts per class and per family, every case that is not hinted/ok (with its
message and hint), and a final line against the targets: 0 silent wrong, 0 died, 0 hangs,
0 artifacts lost, 0 writes outside, >= 95% hinted of the cases that should fail.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="only this family (repeatable)")
    ap.add_argument("--limit", type=int, help="at most N cases (spread over the families)")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--jobs", type=int, default=2, choices=(1, 2))
    ap.add_argument("--id", action="append", help="only the case(s) with this id prefix")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from tests.corpus import FAMILIES, generate, run_all, summarize
    from tests.corpus.harness import CLASSES

    cases = generate(args.seed)
    total = len(cases)
    if args.family:
        unknown = set(args.family) - set(FAMILIES)
        if unknown:
            ap.error(f"unknown family {sorted(unknown)}; known: {', '.join(FAMILIES)}")
        cases = [c for c in cases if c.family in args.family]
    if args.id:
        cases = [c for c in cases if any(c.id.startswith(p) for p in args.id)]
    if args.limit is not None and args.limit < len(cases):
        step = len(cases) / args.limit
        cases = [cases[int(i * step)] for i in range(args.limit)]
    git = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True).stdout.strip()[:100]
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "workbench"],
                           capture_output=True, text=True).stdout.count("\n")
    print(f"engine: {git} ({dirty} file(s) under workbench/ modified)")
    print(f"corpus: seed {args.seed}, {total} cases generated, {len(cases)} selected, "
          f"{args.jobs} at a time")
    t0 = time.monotonic()
    bar = tqdm(total=len(cases), unit="case", file=sys.stderr)

    def tick(res):  # noqa: ANN001
        bar.update(1)
        bar.set_postfix_str(f"{res.id[:40]}: {res.cls}")

    results = run_all(cases, seed=args.seed, jobs=args.jobs, progress=tick)
    bar.close()
    seconds = time.monotonic() - t0
    s = summarize(results)

    print(f"\n{len(results)} cases in {seconds:.0f} s")
    print("per class:  " + ", ".join(f"{c} {n}" for c, n in s["classes"].items()))
    print("\nper family:")
    fams = sorted(s["families"])
    cols = [c for c in CLASSES if any(s["families"][f].get(c) for f in fams)]
    w = max(len(f) for f in fams) if fams else 6
    print("  " + "family".ljust(w) + "".join(f"{c:>14}" for c in cols))
    for f in fams:
        print("  " + f.ljust(w) + "".join(f"{s['families'][f].get(c, 0):>14}" for c in cols))
    bad = [r for r in results if r.cls not in ("hinted", "ok") or r.extra]
    print(f"\nnot hinted/ok: {len(bad)}")
    for r in sorted(bad, key=lambda r: (r.cls, r.family, r.id)):
        cls = "+".join([r.cls, *r.extra])
        print(f"- [{cls}] {r.id} (expect {r.expect}, {r.seconds:.1f} s)")
        if r.error_type or r.message:
            print(f"    {r.error_type}: {' '.join(r.message.split())[:300]}")
        if r.hint:
            print(f"    hint: {' '.join(r.hint.split())[:200]}")
        if r.detail and r.cls not in ("hinted", "unhinted"):
            print(f"    detail: {' '.join(r.detail.split())[:300]}")
    if args.json:
        args.json.write_text(json.dumps({"summary": s, "seconds": seconds,
                                         "results": [r.to_dict() for r in results]}, indent=1))
    z = s["zero_targets"]
    verdict = "TARGETS MET" if s["targets_met"] else "TARGETS NOT MET"
    print(f"\ntargets: silent wrong {z['silent wrong']}/0, died {z['died']}/0, "
          f"hangs {z['hang']}/0, artifacts lost {z['artifact lost']}/0, writes outside "
          f"{z['write outside']}/0, hinted {s['hinted']}/{s['should_fail']} = "
          f"{100 * s['hinted_fraction']:.1f}% (>= 95%) -> {verdict}")
    return 0 if s["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
