"""Task specifications: what a task asks of a model, read from a small TOML or YAML file.

A task is lm-eval's task YAML, a subset of its keys with the same names and meanings, plus the
task types nanochat's CORE adds, so an lm-eval YAML loads as it is and a user who knows one
knows the other:

    task = "arith"                      # its name
    output_type = "multiple_choice"     # see OUTPUT_TYPES
    dataset_path = "arith.jsonl"        # JSONL beside the spec, `json` + dataset_kwargs (lm-eval's
                                        # local form) or `hf:owner/name` (Hugging Face, online)
    test_split = "test"
    doc_to_text = "{{question}}"        # a field name or a Jinja template, as in lm-eval
    doc_to_choice = "choices"           # multiple choice: the choices; schema: the contexts
    doc_to_target = "answer"            # the gold choice's index (or text), or the target text
    doc_to_continuation = "..."         # schema only: the continuation every context shares
    target_delimiter = " "              # between context and continuation
    fewshot_delimiter = "\\n\\n"        # between few-shot examples
    num_fewshot = 0
    generation_kwargs = { until = ["\\n"], max_gen_toks = 64 }
    metric = "exact_match"              # generate_until: exact_match | numeric (GSM8K's #### N)

Output types: `multiple_choice` (the highest log-likelihood continuation: acc, acc_norm by
characters as lm-eval, and nanochat's lowest mean per-token loss), `schema` (the context under
which the shared continuation is most likely, nanochat's CORE), `loglikelihood` (alias
`language_modeling`: the whole target is the greedy continuation), `loglikelihood_rolling`
(perplexity and bits per byte of whole documents), `generate_until` (greedy generation until a
stop string, scored by exact match or a numeric answer) and `code` (HumanEval-style programs,
pass@k by execution).
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

OUTPUT_TYPES = (
    "multiple_choice",
    "schema",
    "loglikelihood",
    "loglikelihood_rolling",
    "generate_until",
    "code",
)
ALIASES = {"language_modeling": "loglikelihood"}
GENERATION_METRICS = ("exact_match", "numeric")
# lm-eval keys a spec may carry that change nothing here (metrics are the output type's own).
IGNORED_KEYS = {"metric_list", "metadata", "tag", "group", "training_split", "should_decontaminate"}


@dataclass
class TaskSpec:
    task: str
    output_type: str
    dataset_path: str
    dataset_name: str | None = None
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    test_split: str = "test"
    validation_split: str | None = None
    fewshot_split: str | None = None
    doc_to_text: str | None = None
    doc_to_choice: str | list[str] | None = None
    doc_to_target: str | int | None = None
    doc_to_continuation: str | None = None
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    description: str = ""
    num_fewshot: int = 0
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    metric: str = "exact_match"
    baseline: float | None = None  # chance accuracy; None: 1 / choices, for choice tasks
    folder: Path = Path(".")  # where relative data paths are read from

    def __post_init__(self) -> None:
        self.output_type = ALIASES.get(self.output_type, self.output_type)
        if self.output_type not in OUTPUT_TYPES:
            raise LmforgeError(
                f"task {self.task!r}: output_type {self.output_type!r} is unknown: use one of "
                f"{', '.join(OUTPUT_TYPES)}"
            )
        if self.metric not in GENERATION_METRICS:
            raise LmforgeError(
                f"task {self.task!r}: metric {self.metric!r} is unknown: use "
                f"{' or '.join(GENERATION_METRICS)}"
            )
        needs = {
            "multiple_choice": ("doc_to_text", "doc_to_choice", "doc_to_target"),
            "schema": ("doc_to_choice", "doc_to_continuation", "doc_to_target"),
            "loglikelihood": ("doc_to_text", "doc_to_target"),
            "loglikelihood_rolling": ("doc_to_target",),
            "generate_until": ("doc_to_text", "doc_to_target"),
            "code": (),
        }[self.output_type]
        missing = [k for k in needs if getattr(self, k) is None]
        if missing:
            raise LmforgeError(
                f"task {self.task!r} ({self.output_type}) needs {', '.join(missing)}: add "
                f"{'it' if len(missing) == 1 else 'them'} to its spec"
            )

    @property
    def until(self) -> list[str]:
        until = self.generation_kwargs.get("until", ["\n\n"])
        return [until] if isinstance(until, str) else list(until)

    @property
    def max_gen_toks(self) -> int:
        return int(self.generation_kwargs.get("max_gen_toks", 256))

    # ---- a document's parts, as lm-eval's ConfigurableTask computes them ------------------

    def text(self, doc: dict) -> str:
        return str(_apply(self.doc_to_text, doc))

    def choices(self, doc: dict) -> list[str]:
        value = self.doc_to_choice
        if isinstance(value, str):
            value = doc[value] if value in doc else ast.literal_eval(render(value, doc))
        return [str(c) for c in value]

    def target(self, doc: dict) -> str | int:
        value = self.doc_to_target
        if isinstance(value, int):
            return value
        target = doc[value] if value in doc else render(value, doc)
        if isinstance(target, str) and target.strip().isdigit() and self.doc_to_choice:
            return int(target.strip())
        return target

    def continuation(self, doc: dict) -> str:
        return str(_apply(self.doc_to_continuation, doc))

    def gold_index(self, doc: dict) -> int:
        """The gold choice of a multiple-choice or schema document, as an index."""
        target, choices = self.target(doc), self.choices(doc)
        if isinstance(target, int):
            gold = target
        elif target in choices:
            gold = choices.index(target)
        else:
            raise LmforgeError(
                f"task {self.task!r}: the target {target!r} is neither an index nor one of the "
                f"choices {choices}: fix doc_to_target"
            )
        if not 0 <= gold < len(choices):
            raise LmforgeError(
                f"task {self.task!r}: gold index {gold} is outside the {len(choices)} choices"
            )
        return gold


def _apply(template: Any, doc: dict) -> Any:
    if isinstance(template, str) and template in doc:
        return doc[template]
    return render(template, doc)


@cache
def _template(source: str) -> Any:
    import jinja2

    return jinja2.Environment(
        keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    ).from_string(source)


def render(template: str, doc: dict) -> str:
    """A Jinja template filled from a document's fields (lm-eval's `apply_template`)."""
    import jinja2

    try:
        return _template(template).render(**doc)
    except jinja2.UndefinedError as e:
        raise LmforgeError(f"template {template!r}: {e}: the document has {sorted(doc)}") from e


def load_spec(path: str | Path) -> TaskSpec:
    """A task from its TOML or YAML spec (lm-eval's task YAMLs included)."""
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"task spec {path} does not exist: pass a .toml or .yaml task file")
    if path.suffix == ".toml":
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise LmforgeError(f"task spec {path} is not valid TOML: {e}") from e
    elif path.suffix in (".yaml", ".yml"):
        raw = _read_yaml(path)
    else:
        raise LmforgeError(f"task spec {path}: use a .toml, .yaml or .yml file")
    return spec_from_dict(raw, path.parent, str(path))


def spec_from_dict(raw: dict[str, Any], folder: Path, origin: str) -> TaskSpec:
    if not isinstance(raw, dict):
        raise LmforgeError(f"task spec {origin} is not a table of keys")
    known = {f.name for f in fields(TaskSpec)} - {"folder"}
    unknown = sorted(set(raw) - known - IGNORED_KEYS)
    if unknown:
        raise LmforgeError(
            f"task spec {origin} has unknown keys {unknown}: see lmforge/eval/tasks.py for the "
            "keys a task takes"
        )
    raw = {k: v for k, v in raw.items() if k in known}
    for key in ("task", "output_type", "dataset_path"):
        if key not in raw:
            raise LmforgeError(f"task spec {origin} has no {key!r}: add it")
    return TaskSpec(**raw, folder=folder)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as e:
        raise LmforgeError(
            f"reading {path} needs PyYAML: pip install 'lmforge[eval]', or write the task as TOML"
        ) from e
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise LmforgeError(f"task spec {path} is not valid YAML: {str(e).splitlines()[0]}") from e


def load_docs(spec: TaskSpec, split: str | None = None) -> list[dict]:
    """The documents of one split of a task's data (its test split by default)."""
    split = split or spec.test_split
    path = spec.dataset_path
    if path.startswith("hf:"):
        return _hf_docs(path[3:], spec.dataset_name, split)
    if path == "json":  # lm-eval's local form: dataset_kwargs.data_files maps split -> file
        files = spec.dataset_kwargs.get("data_files", {})
        files = {"train": files} if isinstance(files, str) else files
        if split not in files:
            raise LmforgeError(
                f"task {spec.task!r} has no data file for split {split!r}: add it to "
                "dataset_kwargs.data_files"
            )
        path = files[split]
    file = Path(path) if Path(path).is_absolute() else spec.folder / path
    return read_jsonl(file)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise LmforgeError(f"task data {path} does not exist: check dataset_path in the spec")
    docs = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise LmforgeError(f"{path}:{n}: not a JSON object ({e.msg})") from e
            if not isinstance(doc, dict):
                raise LmforgeError(f"{path}:{n}: not a JSON object")
            docs.append(doc)
    return docs


def _hf_docs(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError as e:
        raise LmforgeError(
            f"hf:{name} needs the datasets package: pip install 'lmforge[eval]'"
        ) from e
    try:
        return [dict(row) for row in datasets.load_dataset(name, config, split=split)]
    except Exception as e:  # the hub's errors are many; each says what went wrong
        raise LmforgeError(f"hf:{name} (split {split}) could not be loaded: {e}") from e
