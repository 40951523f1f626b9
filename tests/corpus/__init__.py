"""The bad-input and fault corpus of issue 17: generated cases, each run in a child process.

``generate(seed)`` lists the cases (deterministic for a seed); ``run_all`` runs them, two at a
time, each in a fresh child with a memory cap and a timeout, and returns one ``Result`` per
case with its class (hinted, ok, unhinted, foreign, refused, silent wrong, died, hang) and
the sandbox checks (artifact lost, write outside). bench/corpus.py prints the figures;
tests/test_corpus.py runs a lean subset.
"""

from __future__ import annotations

from .generate import FAMILIES, build_base, generate, run_all, summarize
from .harness import Case, Result

__all__ = ["FAMILIES", "Case", "Result", "build_base", "generate", "run_all", "summarize"]
