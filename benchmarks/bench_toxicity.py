"""Benchmark: NSFW and toxic-language detectors on a hand-labelled set of 346 short documents.

The set (tests/data/toxicity_cases.jsonl) labels each line `nsfw` (sexual content) and `toxic`
(strong profanity, slurs, insults, threats, hate) separately, by hand; its `kind` says what the
line is: prose, code, clinical, trap (Scunthorpe-style words: cocktail, Essex, Dick Francis),
mild (damn, hell, crap: labelled clean), sex_mention (news about sex: clean), profanity,
obfuscated, slur, insult, hate, nsfw. Detectors, each asked both questions where it can answer:

- c4-28: the 28-term list lmforge shipped before (one list for both questions, as the step did);
- better-profanity 0.7: its 900-word list with leetspeak variants, `contains_profanity`;
- alt-profanity-check: its trained linear model (scikit-learn) on the package's own vectorizer,
  `predict_prob >= 0.5`, loaded by the package's own loader;
- lmforge-raw: lmforge's lists (wordlists/nsfw_en.txt, toxic_en.txt) without deobfuscation;
- lmforge: `is_nsfw` / `is_toxic`, the lists with leetspeak, mask and spacing handling;
- lmforge+apc: a document is toxic when either lmforge or alt-profanity-check says so.

Prints precision / recall / F1 per detector and question, false positives on code and clinical
lines, and documents per second (single thread, the whole set scored `--reps` times, best rep),
and writes benchmarks/results/toxicity.json.

    .venv/bin/python benchmarks/bench_toxicity.py [--reps 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

from lmforge.data.toxicity import WordList, default_list, is_nsfw, is_toxic  # noqa: E402

CASES = Path(__file__).parent.parent / "tests" / "data" / "toxicity_cases.jsonl"
RESULTS = Path(__file__).parent / "results" / "toxicity.json"
# The list shipped before this benchmark (wordlists/nsfw_en.txt at commit 85a454f).
C4_28 = (
    "anal sex",
    "bdsm",
    "blowjob",
    "bukkake",
    "camgirl",
    "cumshot",
    "deepthroat",
    "dildo",
    "erotica",
    "fellatio",
    "fetish porn",
    "gangbang",
    "handjob",
    "hardcore porn",
    "hentai",
    "masturbate",
    "masturbating",
    "masturbation",
    "milf",
    "nude photos",
    "orgasm",
    "orgy",
    "porn",
    "porno",
    "pornographic",
    "pornography",
    "sexcam",
    "threesome",
)

Batch = Callable[[list[str]], list[bool]]


def load_cases(path: Path = CASES) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def detectors() -> dict[str, tuple[Batch | None, Batch | None]]:
    """name -> (nsfw batch detector, toxic batch detector); None where it cannot answer."""
    from better_profanity import profanity
    from profanity_check import predict_prob

    c4 = WordList(C4_28)
    nsfw_words, toxic_words = default_list("nsfw"), default_list("toxic")

    def c4_batch(texts):
        return [bool(c4.hits(t)) for t in texts]

    def bp_batch(texts):
        return [profanity.contains_profanity(t) for t in texts]

    def apc_batch(texts):
        return [bool(p >= 0.5) for p in predict_prob(texts)]

    def ours(fn):
        return lambda texts: [fn(t)[0] != "clean" for t in texts]

    def either(a, b):
        return lambda texts: [x or y for x, y in zip(a(texts), b(texts), strict=True)]

    profanity.load_censor_words()
    return {
        "c4-28 (before)": (c4_batch, c4_batch),
        "better-profanity": (bp_batch, bp_batch),
        "alt-profanity-check": (apc_batch, apc_batch),
        "lmforge-raw": (
            lambda ts: [bool(nsfw_words.hits(t)) for t in ts],
            lambda ts: [bool(toxic_words.hits(t)) for t in ts],
        ),
        "lmforge (default)": (ours(is_nsfw), ours(is_toxic)),
        "lmforge+apc": (None, either(ours(is_toxic), apc_batch)),
    }


def scores(predicted: list[bool], cases: list[dict], label: str) -> dict:
    truth = [bool(c[label]) for c in cases]
    tp = sum(p and t for p, t in zip(predicted, truth, strict=True))
    fp = sum(p and not t for p, t in zip(predicted, truth, strict=True))
    fn = sum(t and not p for p, t in zip(predicted, truth, strict=True))
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    flagged = {k: 0 for k in ("code", "clinical", "obfuscated")}
    for p, c in zip(predicted, cases, strict=True):
        if c["kind"] in flagged and p:
            flagged[c["kind"]] += 1
    missed = [c["text"] for p, c in zip(predicted, cases, strict=True) if c[label] and not p]
    wrong = [c["text"] for p, c in zip(predicted, cases, strict=True) if p and not c[label]]
    return {
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "flagged_by_kind": flagged,
        "false_positives": wrong,
        "misses": missed,
    }


def timed(batch: Batch, texts: list[str], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        batch(texts)
        best = min(best, time.perf_counter() - t0)
    return len(texts) / best


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line]
    return names[0] if names else platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    cases = load_cases()
    texts = [c["text"] for c in cases]
    n_code = sum(c["kind"] == "code" for c in cases)
    n_clin = sum(c["kind"] == "clinical" for c in cases)
    n_obf = sum(c["kind"] == "obfuscated" for c in cases)
    rows = {}
    header = f"{'detector':<22}{'task':<7}{'P':>7}{'R':>7}{'F1':>7}"
    header += f"{'code FP':>9}{'clin FP':>9}{'obf R':>8}{'docs/s':>10}"
    print(
        f"{len(cases)} cases ({sum(c['toxic'] for c in cases)} toxic, "
        f"{sum(c['nsfw'] for c in cases)} nsfw); CPU: {cpu_name()}\n{header}"
    )
    for name, pair in detectors().items():
        for task, batch in zip(("nsfw", "toxic"), pair, strict=True):
            if batch is None:
                continue
            s = scores(batch(texts), cases, task)
            s["docs_per_s"] = round(timed(batch, texts, args.reps))
            rows[f"{name}/{task}"] = s
            fl = s["flagged_by_kind"]
            print(
                f"{name:<22}{task:<7}{s['precision']:>7.3f}{s['recall']:>7.3f}{s['f1']:>7.3f}"
                f"{fl['code']:>5}/{n_code:<3}{fl['clinical']:>5}/{n_clin:<3}"
                f"{fl['obfuscated'] / n_obf if task == 'toxic' else float('nan'):>8.2f}"
                f"{s['docs_per_s']:>10}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "cases": len(cases),
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "versions": {p: version(p) for p in ("better-profanity", "alt-profanity-check")},
        "results": rows,
    }
    RESULTS.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
