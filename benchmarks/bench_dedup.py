"""Benchmark: near-duplicate detection (MinHash + LSH) against datasketch, and exact-dedup MB/s.

Two corpora: about 11 MB of the Python standard library (the first files in sorted order) with
Jaccard threshold 0.8, and a generated corpus with planted near-duplicates (`lmforge.data.planted`:
5-10 % of a base text's words edited, Jaccard 0.42-0.63 to the base) with threshold 0.3. On each,
single-threaded, in interleaved repetitions:

- ours: `find_near_duplicates` end to end: vectorized shingling and signatures, LSH candidate
  pairs, verification by true Jaccard, union-find clusters; and the streaming `NearDedup` fed
  batches of 64 documents (each checked against all earlier ones, as a pipeline step would);
- datasketch: the same shingles (word 5-grams, words split on ASCII whitespace and control bytes,
  ASCII lowercased) built in Python, `MinHash(num_perm=128, seed=1).update_batch` (default
  affine32 permutations, which ours reproduce bit for bit: checked on every run), `MinHashLSH`
  with the same threshold (hence the same bands x rows), insert then query of every document,
  clusters by union-find over its (unverified) candidates.

Recall and precision are over pairs of documents in one cluster against the planted groups.
*ours* shingles the raw text, as datasketch does (the same shingles); *ours, normalized* is the
default, `find_near_duplicates` with its text normalization (`lmforge.data.shingle_text`).

Normalization recall: a planted corpus whose copies are of four kinds (`planted.KINDS`: word
edits, and copies that differ only in punctuation, accents or no-break spaces), searched with
normalization on and off (and by datasketch, which shingles raw text) at thresholds 0.3 and 0.8;
recall per kind, precision over all pairs. Written to benchmarks/results/dedup_normalization.json.

Exact dedup: whitespace normalization + hash, ours (`fast_text_hash`) against `normalize` + xxh64
(the issue's reference) and + blake2b (the previous `text_hash`). Prints a table and writes
benchmarks/results/dedup.json.

    .venv/bin/python benchmarks/bench_dedup.py [--reps 3] [--stdlib-mb 11] [--planted-bases 2000]
    .venv/bin/python benchmarks/bench_dedup.py --normalization-only [--variant-bases 1000]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import datasketch  # noqa: E402
import numpy as np  # noqa: E402
import xxhash  # noqa: E402
from datasketch import MinHash, MinHashLSH  # noqa: E402

from lmforge.atomic import write_json  # noqa: E402
from lmforge.data import stdlib_documents  # noqa: E402
from lmforge.data.dedup import fast_text_hash, normalize  # noqa: E402
from lmforge.data.lsh import LSHIndex  # noqa: E402
from lmforge.data.minhash import MinHasher  # noqa: E402
from lmforge.data.near_dedup import (  # noqa: E402
    NearDedup,
    clusters_from_pairs,
    find_near_duplicates,
)
from lmforge.data.planted import KINDS, pair_scores, planted_corpus  # noqa: E402
from lmforge.data.shingle_text import TextNormalizer  # noqa: E402

NUM_PERM, NGRAM, SEED = 128, 5, 1
STREAM_BATCH = 64
TARGET_RATIO, TARGET_QUALITY, TARGET_EXACT_MBS = 3.0, 0.95, 300.0
RESULTS = Path(__file__).parent / "results" / "dedup.json"
NORMALIZATION_RESULTS = RESULTS.with_name("dedup_normalization.json")
NORMALIZATION_THRESHOLDS = (0.3, 0.8)
_CONTROLS_TO_SPACE = bytes(b if b > 32 else 32 for b in range(256))


def reference_shingles(text: str) -> list[bytes]:
    """Word 5-grams as datasketch users build them, with the words lmforge uses."""
    words = text.encode("utf-8", "surrogatepass").lower().translate(_CONTROLS_TO_SPACE).split()
    if 0 < len(words) < NGRAM:
        return [b" ".join(words)]
    return [b" ".join(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)]


def run_datasketch(texts: list[str], threshold: float) -> dict:
    t0 = time.perf_counter()
    shingles = [reference_shingles(t) for t in texts]
    t1 = time.perf_counter()
    sketches = []
    for s in shingles:
        m = MinHash(num_perm=NUM_PERM, seed=SEED)
        m.update_batch(s)
        sketches.append(m)
    t2 = time.perf_counter()
    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    present = [i for i, s in enumerate(shingles) if s]
    for i in present:
        lsh.insert(i, sketches[i])
    pairs = {(min(i, j), max(i, j)) for i in present for j in lsh.query(sketches[i]) if j != i}
    clusters = clusters_from_pairs(sorted(pairs))
    t3 = time.perf_counter()
    return {
        "shingle_s": t1 - t0,
        "signature_s": t2 - t1,
        "lsh_s": t3 - t2,
        "total_s": t3 - t0,
        "bands_rows": [lsh.b, lsh.r],
        "candidate_pairs": len(pairs),
        "clusters": clusters,
    }


def run_ours(texts: list[str], threshold: float, normalize: bool = False) -> dict:
    t0 = time.perf_counter()
    found = find_near_duplicates(texts, threshold, NUM_PERM, NGRAM, SEED, normalize=normalize)
    total = time.perf_counter() - t0
    hasher = MinHasher(NUM_PERM, NGRAM, SEED, normalize=TextNormalizer() if normalize else None)
    index = LSHIndex(threshold, NUM_PERM)
    t0 = time.perf_counter()
    signatures = hasher.signatures(texts)
    t1 = time.perf_counter()
    index.candidate_pairs(signatures)
    t2 = time.perf_counter()
    return {
        "signature_s": t1 - t0,
        "lsh_s": t2 - t1,
        "total_s": total,
        "bands_rows": [found.bands, found.rows],
        "candidate_pairs": found.candidate_pairs,
        "verified_pairs": found.verified_pairs,
        "clusters": found.clusters,
    }


def run_stream(texts: list[str], threshold: float) -> dict:
    t0 = time.perf_counter()
    dedup = NearDedup(threshold, NUM_PERM, NGRAM, SEED, normalize=False)
    for lo in range(0, len(texts), STREAM_BATCH):
        dedup.add_batch(texts[lo : lo + STREAM_BATCH])
    total = time.perf_counter() - t0
    return {
        "total_s": total,
        "bands_rows": [dedup.index.bands, dedup.index.rows],
        "candidate_pairs": len(dedup.matches),
        "clusters": dedup.clusters(),
    }


def check_same_minhash(texts: list[str]) -> None:
    """Our signatures equal datasketch's fed the same 32-bit shingle hashes; same shingle sets."""
    hasher = MinHasher(NUM_PERM, NGRAM, SEED)
    sigs = hasher.signatures(texts)
    grams, offsets = hasher.shingles(texts)
    for i, text in enumerate(texts):
        mine = grams[offsets[i] : offsets[i + 1]]
        m = MinHash(num_perm=NUM_PERM, seed=SEED, hashfunc=int)
        m.update_batch((mine & np.uint64(0xFFFFFFFF)).tolist())
        assert np.array_equal(m.hashvalues, sigs[i]), f"signature {i} differs from datasketch"
        assert len(np.unique(mine)) == len(set(reference_shingles(text))), f"shingles of {i}"


def exact_rates(texts: list[str], reps: int) -> dict:
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    methods = {
        "ours: fast_text_hash (xxh3-128)": fast_text_hash,
        "normalize + xxh64": lambda t: xxhash.xxh64_digest(normalize(t).encode()),
        "normalize + blake2b (old text_hash)": lambda t: hashlib.blake2b(
            normalize(t).encode(), digest_size=16
        ).digest(),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(reps):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            for t in texts:
                fn(t)
            times[name].append(time.perf_counter() - t0)
    return {name: size / statistics.median(ts) for name, ts in times.items()}


def stdlib_subset(megabytes: float) -> list[str]:
    texts, size = [], 0
    for doc in stdlib_documents():
        texts.append(doc.text)
        size += len(doc.text.encode())
        if megabytes and size >= megabytes * 1e6:
            break
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each side")
    parser.add_argument("--stdlib-mb", type=float, default=11, help="0: the whole stdlib")
    parser.add_argument("--planted-bases", type=int, default=2000, help="base texts generated")
    parser.add_argument("--variant-bases", type=int, default=1000, help="bases, recall by kind")
    parser.add_argument(
        "--normalization-only", action="store_true", help="only the normalization recall table"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()

    recall = normalization_recall(args.variant_bases)
    report_normalization(recall)
    write_normalization(recall, args)
    if args.normalization_only:
        return

    planted = planted_corpus(n_base=args.planted_bases, seed=0)
    corpora = {
        "stdlib": (stdlib_subset(args.stdlib_mb), 0.8, None),
        "planted": (planted.texts, 0.3, planted.groups),
    }
    results: dict = {}
    for name, (texts, threshold, groups) in corpora.items():
        check_same_minhash(texts[:25])
        runs = {"datasketch": [], "ours": [], "ours_normalized": [], "ours_stream": []}
        for _ in range(args.reps):  # interleaved, so all sides see the same machine load
            runs["datasketch"].append(run_datasketch(texts, threshold))
            runs["ours"].append(run_ours(texts, threshold))
            runs["ours_normalized"].append(run_ours(texts, threshold, normalize=True))
            runs["ours_stream"].append(run_stream(texts, threshold))
        mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
        entry: dict = {"documents": len(texts), "mb": mb, "threshold": threshold}
        for side, side_runs in runs.items():
            timing = {
                k: statistics.median(r[k] for r in side_runs)
                for k in side_runs[0]
                if k.endswith("_s")
            }
            last = side_runs[-1]
            summary = {
                **timing,
                "docs_per_s": len(texts) / timing["total_s"],
                "mb_per_s": mb / timing["total_s"],
                "bands_rows": last["bands_rows"],
                "candidate_pairs": last["candidate_pairs"],
                "clusters": len(last["clusters"]),
                "removed": sum(len(c) - 1 for c in last["clusters"]),
            }
            if "verified_pairs" in last:
                summary["verified_pairs"] = last["verified_pairs"]
            if groups is not None:
                summary["precision"], summary["recall"] = pair_scores(last["clusters"], groups)
            entry[side] = summary
        entry["speedup"] = entry["ours"]["docs_per_s"] / entry["datasketch"]["docs_per_s"]
        entry["stream_speedup"] = (
            entry["ours_stream"]["docs_per_s"] / entry["datasketch"]["docs_per_s"]
        )
        results[name] = entry

    exact = {"stdlib (all)": exact_rates(stdlib_subset(0), args.reps)}
    exact["planted"] = exact_rates(planted.texts, args.reps)
    report(results, exact)
    write(results, exact, args)


def report(results: dict, exact: dict) -> None:
    print(f"near-duplicates, single thread, {NUM_PERM} permutations, word {NGRAM}-gram shingles")
    columns = ("docs/s", "MB/s", "shingle+sig s", "LSH s", "total s", "clusters", "prec.", "recall")
    print(f"{'corpus':<9}{'side':<16}" + "".join(f"{c:>{len(c) + 2}}" for c in columns))
    for name, entry in results.items():
        for side in ("datasketch", "ours", "ours_normalized", "ours_stream"):
            r = entry[side]
            sig = r["signature_s"] + r.get("shingle_s", 0.0) if "signature_s" in r else None
            cells = (
                f"{r['docs_per_s']:.0f}",
                f"{r['mb_per_s']:.1f}",
                "-" if sig is None else f"{sig:.3f}",
                f"{r['lsh_s']:.3f}" if "lsh_s" in r else "-",
                f"{r['total_s']:.3f}",
                str(r["clusters"]),
                f"{r['precision']:.3f}" if "precision" in r else "-",
                f"{r['recall']:.3f}" if "recall" in r else "-",
            )
            widths = (len(c) + 2 for c in columns)
            print(
                f"{name:<9}{side:<16}"
                + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
            )
        print(
            f"  {name}: {entry['documents']} documents, {entry['mb']:.1f} MB, threshold "
            f"{entry['threshold']}, bands x rows {entry['ours']['bands_rows']}: ours "
            f"{entry['speedup']:.1f}x datasketch's documents/s (target {TARGET_RATIO:.0f}x), "
            f"streaming {entry['stream_speedup']:.1f}x"
        )
        if "recall" in entry["ours"]:
            ok = min(entry["ours"]["precision"], entry["ours"]["recall"]) >= TARGET_QUALITY
            verdict = "meets" if ok else "misses"
            print(f"  {name}: ours {verdict} the {TARGET_QUALITY} recall and precision target")
    print("exact dedup (normalize + hash), single thread, MB/s")
    for corpus, rates in exact.items():
        for method, rate in rates.items():
            print(f"  {corpus:<14}{method:<38}{rate:>8.0f}")
        ours, base = rates["ours: fast_text_hash (xxh3-128)"], rates["normalize + xxh64"]
        verdict = "meets" if ours >= TARGET_EXACT_MBS else "misses"
        print(
            f"  {corpus}: ours {ours / base:.1f}x normalize + xxh64; {verdict} the "
            f"{TARGET_EXACT_MBS:.0f} MB/s target"
        )


def normalization_recall(n_base: int) -> dict:
    """Recall per kind of planted copy and overall precision, normalization on and off."""
    corpus = planted_corpus(n_base=n_base, seed=0, kinds=KINDS)
    out: dict = {
        "documents": len(corpus.texts),
        "groups": {kind: len(corpus.of_kind(kind)) for kind in KINDS},
        "pairs": {kind: len(planted_pairs(corpus.of_kind(kind))) for kind in KINDS},
        "runs": [],
    }
    for threshold in NORMALIZATION_THRESHOLDS:
        sides = {
            "datasketch (raw)": lambda t=threshold: run_datasketch(corpus.texts, t)["clusters"],
            "ours, raw": lambda t=threshold: (
                find_near_duplicates(
                    corpus.texts, t, NUM_PERM, NGRAM, SEED, normalize=False
                ).clusters
            ),
            "ours, normalized": lambda t=threshold: (
                find_near_duplicates(corpus.texts, t, NUM_PERM, NGRAM, SEED).clusters
            ),
        }
        for side, run in sides.items():
            clusters = run()
            recall = {kind: pair_scores(clusters, corpus.of_kind(kind))[1] for kind in KINDS}
            precision, overall = pair_scores(clusters, corpus.groups)
            out["runs"].append(
                {
                    "threshold": threshold,
                    "side": side,
                    "recall": {**recall, "all": overall},
                    "precision": precision,
                }
            )
    return out


def planted_pairs(groups: list[list[int]]) -> set[tuple[int, int]]:
    return {(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1 :]}


def report_normalization(recall: dict) -> None:
    print(
        f"normalization recall: {recall['documents']} documents, planted groups per kind "
        + ", ".join(f"{k} {n}" for k, n in recall["groups"].items())
    )
    kinds = (*KINDS, "all")
    print(f"{'threshold':<11}{'side':<19}" + "".join(f"{k:>13}" for k in kinds) + f"{'prec.':>8}")
    for run in recall["runs"]:
        cells = "".join(f"{run['recall'][k]:>13.3f}" for k in kinds)
        print(f"{run['threshold']:<11}{run['side']:<19}{cells}{run['precision']:>8.3f}")


def write_normalization(recall: dict, args: argparse.Namespace) -> None:
    NORMALIZATION_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "num_perm": NUM_PERM,
        "ngram": NGRAM,
        "seed": SEED,
        "variant_bases": args.variant_bases,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "datasketch": datasketch.__version__,
    }
    payload = {"benchmark": "dedup_normalization", "setup": setup, **recall}
    write_json(NORMALIZATION_RESULTS, payload)
    print(f"wrote {NORMALIZATION_RESULTS}")


def write(results: dict, exact: dict, args: argparse.Namespace) -> None:
    setup = {
        "num_perm": NUM_PERM,
        "ngram": NGRAM,
        "seed": SEED,
        "reps": args.reps,
        "stdlib_mb": args.stdlib_mb,
        "planted_bases": args.planted_bases,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "datasketch": datasketch.__version__,
        "xxhash": xxhash.VERSION,
    }
    payload = {"benchmark": "dedup", "setup": setup, "near_duplicates": results, "exact": exact}
    write_json(args.results, payload)
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
