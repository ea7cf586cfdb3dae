"""The built-in code suite: three tasks made from held-out source files, for models trained on
code (the speedrun's), with their chance baselines and a CORE-style aggregate.

Only documents of the validation split are used, so no example was seen in training:

- `code_next_line` (multiple choice, HellaSwag-style): the preceding lines of a function; the
  true next line against 3 lines drawn from other files. Chance: 1/4.
- `code_identifier` (greedy, LAMBADA-style): the preceding lines and the start of a line; the
  line's last identifier (not a keyword) must be the model's greedy continuation, every token
  of it. Chance: 0.
- `code_closing` (schema, CORE-style): a line that ends in two or more closing brackets, written
  with its true closers and with 3 wrong ones (one missing, one extra, two swapped...); the
  model chooses the version under which the next line is most likely. Chance: 1/4.

The aggregate is CORE's: the mean over tasks of (accuracy - chance) / (1 - chance).
Examples are drawn by a seeded generator from the documents in a fixed order, so the same
documents always give the same suite.
"""

from __future__ import annotations

import keyword
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from lmforge.data import Document
from lmforge.eval.metrics import mean
from lmforge.eval.tasks import TaskSpec

CONTEXT_LINES = 8  # lines of code before the point each example asks about
MAX_CONTEXT_CHARS = 480
MIN_LINE_CHARS = 12
CHOICES = 4
DEFAULT_EXAMPLES = 200  # per task
_IDENTIFIER_END = re.compile(r"^(.*[\s.(\[,=])([A-Za-z_][A-Za-z0-9_]{2,})$")
_CLOSERS = re.compile(r"[)\]}]{2,}$")
PAIRS = {")": "(", "]": "[", "}": "{"}


@dataclass
class SuiteTask:
    spec: TaskSpec
    docs: list[dict]


def code_suite(
    documents: Iterable[Document], examples: int = DEFAULT_EXAMPLES, seed: int = 0
) -> list[SuiteTask]:
    """The suite's tasks built from `documents` (pass the validation split only)."""
    files = [d.text.splitlines() for d in sorted(documents, key=lambda d: d.id)]
    files = [lines for lines in files if len(lines) > CONTEXT_LINES]
    rng = random.Random(seed)
    candidates = [(f, i) for f, lines in enumerate(files) for i in range(CONTEXT_LINES, len(lines))]
    rng.shuffle(candidates)
    next_line, identifier, closing = [], [], []
    for f, i in candidates:
        lines = files[f]
        line = lines[i]
        if len(line.strip()) < MIN_LINE_CHARS or line.lstrip().startswith("#"):
            continue
        context = _context(lines, i)
        if len(next_line) < examples:
            doc = _next_line_doc(files, f, context, line, rng)
            if doc:
                next_line.append(doc)
        if len(identifier) < examples:
            match = _IDENTIFIER_END.match(line.rstrip())
            if match and match.group(1).strip() and not keyword.iskeyword(match.group(2)):
                identifier.append(
                    {"context": context + "\n" + match.group(1), "target": match.group(2)}
                )
        if len(closing) < examples and i + 1 < len(lines) and lines[i + 1].strip():
            doc = _closing_doc(context, line.rstrip(), lines[i + 1], rng)
            if doc:
                closing.append(doc)
        if min(len(next_line), len(identifier), len(closing)) >= examples:
            break
    return [
        SuiteTask(_spec("code_next_line", "multiple_choice", doc_to_text="context",
                        doc_to_choice="choices", doc_to_target="gold", target_delimiter="\n",
                        baseline=1 / CHOICES), next_line),
        SuiteTask(_spec("code_identifier", "loglikelihood", doc_to_text="context",
                        doc_to_target="target", target_delimiter="", baseline=0.0), identifier),
        SuiteTask(_spec("code_closing", "schema", doc_to_choice="contexts",
                        doc_to_continuation="continuation", doc_to_target="gold",
                        target_delimiter="\n", baseline=1 / CHOICES), closing),
    ]  # fmt: skip


def _spec(task: str, output_type: str, **keys) -> TaskSpec:
    return TaskSpec(task=task, output_type=output_type, dataset_path="builtin:code", **keys)


def _context(lines: list[str], i: int) -> str:
    return "\n".join(lines[max(0, i - CONTEXT_LINES) : i])[-MAX_CONTEXT_CHARS:]


def _next_line_doc(
    files: list[list[str]], f: int, context: str, line: str, rng: random.Random
) -> dict | None:
    distractors: list[str] = []
    for _ in range(20):
        other = rng.randrange(len(files))
        if other == f:
            continue
        pick = rng.choice(files[other])
        if len(pick.strip()) >= MIN_LINE_CHARS and pick != line and pick not in distractors:
            distractors.append(pick)
        if len(distractors) == CHOICES - 1:
            break
    else:
        return None
    choices = [line, *distractors]
    rng.shuffle(choices)
    return {"context": context, "choices": choices, "gold": choices.index(line)}


def _closing_doc(context: str, line: str, after: str, rng: random.Random) -> dict | None:
    found = _CLOSERS.search(line)
    if not found:
        return None
    head, closers = line[: found.start()], found.group()
    wrong = _wrong_closers(closers)
    if len(wrong) < CHOICES - 1:
        return None
    options = [closers, *rng.sample(sorted(wrong), CHOICES - 1)]
    rng.shuffle(options)
    return {
        "contexts": [context + "\n" + head + c for c in options],
        "continuation": after,
        "gold": options.index(closers),
    }


def _wrong_closers(closers: str) -> set[str]:
    """Plausible mistakes: one closer missing, one doubled, one of another kind, two swapped."""
    wrong = {closers[1:], closers + closers[-1], closers[:-1] + closers[-1] * 2}
    for i, c in enumerate(closers):
        for other in PAIRS:
            if other != c:
                wrong.add(closers[:i] + other + closers[i + 1 :])
    for i in range(len(closers) - 1):
        wrong.add(closers[:i] + closers[i + 1] + closers[i] + closers[i + 2 :])
    wrong.discard(closers)
    return {w for w in wrong if w}


def aggregate(centered_scores: list[float]) -> float:
    """CORE's aggregate: the mean of the tasks' centered accuracies."""
    return mean(centered_scores)
