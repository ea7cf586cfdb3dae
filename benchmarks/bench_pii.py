"""Benchmark: PII masking precision and recall per type on the labelled set.

The set is tests/data/pii_cases.jsonl: hand-written strings, each with its profile (prose or
code), where the PII sits (sentence-final, parenthesised, quoted, in a URL, in code, ...) and
the exact substrings that must be masked; traps (version numbers, timestamps, ISBNs, hashes,
C++ scopes, Python slices) must stay unchanged. Scored twice: with each case's labelled profile,
and with `profile = auto` (the masker decides from the text, as the pipeline step does for
documents whose meta does not name a source file). Prints a table, lists every error and writes
benchmarks/results/pii.json.

    .venv/bin/python benchmarks/bench_pii.py [--cases tests/data/pii_cases.jsonl]
"""

from __future__ import annotations

import argparse
import json
import platform
from collections import Counter
from pathlib import Path

from lmforge.data.pii_eval import case_errors, format_table, load_cases, score

CASES = Path(__file__).parent.parent / "tests" / "data" / "pii_cases.jsonl"
RESULTS = Path(__file__).parent / "results" / "pii.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    cases = load_cases(args.cases)
    result = {
        "benchmark": "pii",
        "command": "python benchmarks/bench_pii.py",
        "cases": len(cases),
        "traps": sum(not case["pii"] for case in cases),
        "contexts": dict(Counter(case["context"] for case in cases)),
        "python": platform.python_version(),
    }
    for name, profile in (("labelled_profile", None), ("auto_profile", "auto")):
        run = [case if profile is None else {**case, "profile": profile} for case in cases]
        scores = score(run)
        print(f"\n{name} ({len(cases)} cases):\n{format_table(scores, run)}")
        errors = []
        for case in run:
            _, fp, fn = case_errors(case)
            if fp or fn:
                errors.append({"text": case["text"], "false_pos": list(fp), "false_neg": list(fn)})
                print(f"  {case['text']!r}: false pos. {list(fp)}, false neg. {list(fn)}")
        per_type = {
            kind: {"tp": s.tp, "fp": s.fp, "fn": s.fn, "precision": s.precision, "recall": s.recall}
            for kind, s in scores.items()
        }
        result[name] = {"per_type": per_type, "errors": errors}
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
