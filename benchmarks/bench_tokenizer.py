"""Benchmark: BPE training and encoding speed, ours next to Hugging Face tokenizers, rustbpe and
tiktoken, on the same text in one run.

Corpus: the first ~11 MB (by sorted path) of the running interpreter's standard-library .py
files, tests left out. Training: vocabulary 8192 with <|endoftext|> (7935 merges, GPT-2 pattern)
by our trainer with 1 and 2 worker processes, Hugging Face's BpeTrainer and rustbpe with 1 and 2
threads (RAYON_NUM_THREADS). Encoding, one thread, GPT-2's vocabulary: our production path
(tiktoken's compiled core built from our ranks), tiktoken's gpt2, Hugging Face tokenizers loading
our tokenizer.json, and our pure-Python reference from a cold cache, taking turns file by file.
Every repetition runs in fresh processes, repetitions interleaved. The table shows medians; a
ratio is the median over repetitions of the ratio within one, so load that varies between
repetitions (the machine may be shared) cancels out. Prints a table and writes
benchmarks/results/tokenizer.json.

    .venv/bin/python benchmarks/bench_tokenizer.py [--reps 5] [--mb 11]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "tokenizer.json"
EOT = "<|endoftext|>"
VOCAB = 8192
TRAIN = {  # name -> (library, threads or workers)
    "lmforge, 1 worker": ("lmforge", 1),
    "lmforge, 2 workers": ("lmforge", 2),
    "HF tokenizers, 1 thread": ("hf", 1),
    "HF tokenizers, 2 threads": ("hf", 2),
    "rustbpe, 1 thread": ("rustbpe", 1),
    "rustbpe, 2 threads": ("rustbpe", 2),
}
ENCODE = {
    "lmforge (production)": "lmforge",
    "tiktoken gpt2": "tiktoken",
    "HF tokenizers": "hf",
    "lmforge pure Python (cold cache)": "python",
}


def corpus(megabytes: float) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages"}
    texts, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        texts.append(text)
        size += len(text.encode("utf-8"))
        if size >= megabytes * 1e6:
            break
    return texts


def gpt2_ranks() -> dict[bytes, int]:
    from lmforge.tokenizer.tiktoken_file import read_tiktoken

    spec = importlib.util.find_spec("whisper")
    if spec is None:
        sys.exit("needs GPT-2's ranks: pip install --no-deps openai-whisper (see the Makefile)")
    return read_tiktoken(Path(spec.submodule_search_locations[0]) / "assets" / "gpt2.tiktoken")


# -- one measurement (runs in a child process) --------------------------------------------------


def train_once(library: str, threads: int, texts: list[str]) -> float:
    from lmforge.tokenizer import GPT2_PATTERN, train_bpe

    if library == "lmforge":
        start = time.perf_counter()
        train_bpe(texts, VOCAB, [EOT], GPT2_PATTERN, workers=threads)
        return time.perf_counter() - start
    if library == "hf":
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        start = time.perf_counter()
        tok.train_from_iterator(texts, trainer)
        return time.perf_counter() - start
    import rustbpe

    tok = rustbpe.Tokenizer()
    start = time.perf_counter()
    tok.train_from_iterator(iter(texts), VOCAB - 1, pattern=GPT2_PATTERN)  # no special token
    return time.perf_counter() - start


def encoders(folder: Path) -> dict[str, Callable[[str], list[int]]]:
    """Each encoder of ENCODE, by name, ready to encode ordinary text."""
    import tiktoken
    from tokenizers import Tokenizer as HFTokenizer

    from lmforge.tokenizer import GPT2_PATTERN, Tokenizer

    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    reference = tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=gpt2_ranks(), special_tokens={EOT: 50256}
    )
    ours = Tokenizer.load(folder, backend="tiktoken")
    python = Tokenizer.load(folder, backend="python")
    for tok in (ours, python):
        tok.encode_ordinary("warm up")  # builds the compiled core; the cache stays nearly empty
    by_library = {
        "lmforge": ours.encode_ordinary,
        "tiktoken": reference.encode_ordinary,
        "hf": lambda text: hf.encode(text, add_special_tokens=False).ids,
        "python": python.encode_ordinary,
    }
    return {name: by_library[library] for name, library in ENCODE.items()}


def encode_once(texts: list[str], folder: Path) -> dict[str, dict]:
    """Seconds each encoder takes over all texts, and a hash of its ids. Encoders take turns
    text by text (rotating who goes first), so a change in machine load hits them alike."""
    import hashlib

    encode = encoders(folder)
    names = list(encode)
    seconds = dict.fromkeys(names, 0.0)
    ids: dict[str, list] = {name: [] for name in names}
    gc.disable()  # a collection would charge whichever encoder happened to trigger it
    for i, text in enumerate(texts):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            result = encode[name](text)
            seconds[name] += time.perf_counter() - start
            ids[name].append(result)
    gc.enable()
    return {
        name: {
            "seconds": seconds[name],
            "ids": hashlib.sha256(json.dumps(ids[name]).encode()).hexdigest()[:16],
        }
        for name in names
    }


def child(args: argparse.Namespace) -> None:
    texts = corpus(args.mb)
    if args.task == "train":
        result: dict = {"seconds": train_once(args.library, args.threads, texts)}
    else:
        result = encode_once(texts, Path(args.folder))
    print(json.dumps(result))


# -- the run (parent process) -------------------------------------------------------------------


def measure(task: str, library: str, threads: int, mb: float, folder: Path) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "LMFORGE_PROGRESS": "0"}
    env["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    command = [sys.executable, __file__, "--child", task, "--library", library]
    command += ["--threads", str(threads), "--mb", str(mb), "--folder", str(folder)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mb", type=float, default=11.0, help="corpus size in MB")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=["train", "encode"], dest="task", help=argparse.SUPPRESS)
    parser.add_argument("--library", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        return child(args)

    from lmforge.tokenizer import GPT2_PATTERN, Tokenizer

    texts = corpus(args.mb)
    size = sum(len(t.encode("utf-8")) for t in texts)
    folder = Path(tempfile.mkdtemp(prefix="bench-tokenizer-"))
    Tokenizer(gpt2_ranks(), {EOT: 50256}, GPT2_PATTERN).save(folder)  # all formats, GPT-2's vocab
    print(f"corpus: {len(texts)} stdlib files, {size / 1e6:.1f} MB; {args.reps} repetitions")

    train = {name: [] for name in TRAIN}
    encode = {name: [] for name in ENCODE}
    digests = {name: set() for name in ENCODE}
    for rep in range(args.reps):
        for name, (library, threads) in TRAIN.items():
            train[name].append(measure("train", library, threads, args.mb, folder)["seconds"])
        for name, result in measure("encode", "all", 1, args.mb, folder).items():
            encode[name].append(size / 1e6 / result["seconds"])
            digests[name].add(result["ids"])
        print(f"  repetition {rep + 1}/{args.reps} done")

    train_s = {name: statistics.median(v) for name, v in train.items()}
    encode_mbs = {name: statistics.median(v) for name, v in encode.items()}

    # Ratios pair the measurements of one repetition (run back to back, or text by text for
    # encoding), then take the median: load that changes between repetitions cancels out.
    def paired(values: dict, a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(values[a], values[b], strict=True))

    ratios = {
        "train: lmforge 1 worker / HF 1 thread (target <= 2)": paired(
            train, "lmforge, 1 worker", "HF tokenizers, 1 thread"
        ),
        "train: lmforge 2 workers / HF 2 threads (target <= 1)": paired(
            train, "lmforge, 2 workers", "HF tokenizers, 2 threads"
        ),
        "train: lmforge 2 workers / HF 1 thread": paired(
            train, "lmforge, 2 workers", "HF tokenizers, 1 thread"
        ),
        "train: lmforge 2 workers / lmforge 1 worker": paired(
            train, "lmforge, 2 workers", "lmforge, 1 worker"
        ),
        "train: lmforge 1 worker / rustbpe 1 thread": paired(
            train, "lmforge, 1 worker", "rustbpe, 1 thread"
        ),
        "encode: lmforge production / tiktoken (target >= 0.9)": paired(
            encode, "lmforge (production)", "tiktoken gpt2"
        ),
        "encode: HF tokenizers / tiktoken": paired(encode, "HF tokenizers", "tiktoken gpt2"),
        "encode: lmforge pure Python MB/s (target >= 1)": encode_mbs[
            "lmforge pure Python (cold cache)"
        ],
    }
    same_ids = len(set().union(*digests.values())) == 1

    print(f"\ntraining, vocabulary {VOCAB}, {size / 1e6:.1f} MB (median seconds of {args.reps})")
    hf1 = train_s["HF tokenizers, 1 thread"]
    for name, seconds in train_s.items():
        best = min(train[name])
        print(f"  {name:<26} {seconds:6.2f} s (best {best:5.2f})  {hf1 / seconds:5.2f}x HF-1 speed")
    print(f"\nencoding, GPT-2 vocabulary, one thread (median MB/s of {args.reps})")
    tiktoken_mbs = encode_mbs["tiktoken gpt2"]
    for name, mbs in encode_mbs.items():
        best = max(encode[name])
        print(
            f"  {name:<34} {mbs:6.2f} MB/s (best {best:5.2f})  {mbs / tiktoken_mbs:5.2f}x tiktoken"
        )
    print(f"  identical ids from all four: {same_ids}")
    print("\nratios (median over repetitions of the ratio within a repetition)")
    for name, value in ratios.items():
        print(f"  {name:<56} {value:6.2f}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "tokenizer",
        "command": "python benchmarks/bench_tokenizer.py " + f"--reps {args.reps} --mb {args.mb}",
        "corpus": {"files": len(texts), "bytes": size, "source": "stdlib .py, tests excluded"},
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "versions": {
            lib: importlib.metadata.version(lib) for lib in ("tiktoken", "tokenizers", "rustbpe")
        },
        "train_seconds": {
            "median": train_s,
            "best": {name: min(v) for name, v in train.items()},
            "all": train,
        },
        "encode_mb_per_s": {
            "median": encode_mbs,
            "best": {name: max(v) for name, v in encode.items()},
            "all": encode,
        },
        "identical_ids": same_ids,
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
