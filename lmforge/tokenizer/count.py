"""Pre-token counting over a stream of chunks, in this process or in worker processes.

Workers take chunks from a bounded queue (so reading never runs far ahead of counting), keep their
own counts, and send them back once at the end. Counts are sums, so the result does not depend on
how chunks were shared out.
"""

from __future__ import annotations

import pickle
import queue
from collections import Counter
from collections.abc import Iterable, Sequence

from lmforge.progress import bar
from lmforge.tokenizer.pretokenize import compile_pattern, split_special
from lmforge.tokenizer.sources import Chunk, jsonl_texts
from lmforge.tokenizer.workers import context

# Chunks waiting per worker: enough to keep it busy, few enough to bound memory.
QUEUE_PER_WORKER = 2


def count_chunk(chunk: Chunk, specials: Sequence[str], pattern: str, counts: Counter[str]) -> None:
    """Add the pre-tokens of `chunk` to `counts`; special tokens split text and are not counted."""
    findall = compile_pattern(pattern).findall
    texts = jsonl_texts(chunk) if chunk.jsonl else chunk.texts
    for text in texts:
        if specials:
            for piece, is_special in split_special(text, specials):
                if not is_special:
                    counts.update(findall(piece))
        else:
            counts.update(findall(text))


def count_pretokens(
    chunks: Iterable[Chunk],
    specials: Sequence[str],
    pattern: str,
    workers: int = 1,
    total: int | None = None,
) -> Counter[str]:
    """Frequency of every pre-token in `chunks`, counted by `workers` processes (1: this one).

    `total`, the input size in bytes when known, gives the progress bar its ETA."""
    chunks = iter(chunks)
    counts: Counter[str] = Counter()
    progress = bar(desc="pre-tokenize", total=total, unit="B", unit_scale=True, unit_divisor=1024)
    with progress:
        first = next(chunks, None)
        second = next(chunks, None) if first is not None else None
        if workers <= 1 or second is None:  # one chunk is not worth a process
            for chunk in _chain(first, second, chunks):
                count_chunk(chunk, specials, pattern, counts)
                progress.update(chunk.size)
            return counts
        return _count_in_workers(
            _chain(first, second, chunks), specials, pattern, workers, progress
        )


def _count_in_workers(chunks, specials, pattern, workers, progress) -> Counter[str]:
    ctx = context()
    tasks = ctx.Queue(maxsize=QUEUE_PER_WORKER * workers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(tasks, results, list(specials), pattern), daemon=True)
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    counts: Counter[str] = Counter()
    done = 0
    try:
        for chunk in chunks:
            while True:  # wait for room in the queue, showing progress meanwhile
                done += _drain(results, counts, progress)
                try:
                    tasks.put(chunk, timeout=0.05)
                    break
                except queue.Full:
                    _check(procs)
        for _ in procs:
            tasks.put(None)
        while done < workers:
            exited = all(p.exitcode is not None for p in procs)
            done += _drain(results, counts, progress, timeout=0.1)
            _check(procs)
            if exited and done < workers:  # drained after every worker had exited
                raise RuntimeError("pre-tokenization workers exited without sending their counts")
    except BaseException:
        tasks.cancel_join_thread()  # chunks left in the queue must not block this process's exit
        raise
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    return counts


def _drain(results, counts: Counter[str], progress, timeout: float = 0.0) -> int:
    """Handle the messages waiting on `results`; returns how many workers sent their counts."""
    done = 0
    while True:
        try:
            kind, value = results.get(timeout=timeout) if timeout else results.get_nowait()
        except queue.Empty:
            return done
        timeout = 0.0
        if kind == "bytes":
            progress.update(value)
        elif kind == "counts":
            counts.update(value)
            done += 1
        else:
            raise value


def _check(procs) -> None:
    """Raise if a worker died (killed, out of memory)."""
    for p in procs:
        if p.exitcode not in (None, 0):
            raise RuntimeError(f"a pre-tokenization worker died (exit code {p.exitcode})")


def _worker(tasks, results, specials: list[str], pattern: str) -> None:
    counts: Counter[str] = Counter()
    try:
        while (chunk := tasks.get()) is not None:
            count_chunk(chunk, specials, pattern, counts)
            results.put(("bytes", chunk.size))
        results.put(("counts", counts))
    except BaseException as e:  # sent back so the parent raises the real error
        try:
            pickle.dumps(e)
        except Exception:
            e = RuntimeError(f"pre-tokenization worker failed: {e!r}")
        results.put(("error", e))


def _chain(first, second, rest):
    for chunk in (first, second):
        if chunk is not None:
            yield chunk
    yield from rest
