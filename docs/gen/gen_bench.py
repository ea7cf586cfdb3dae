"""docs/benchmarks/*.md from benchmarks/results/*.json, so a number in the docs can only come
from a results file: one page per results file (the method from its script's docstring, the
machine and versions the file records, every table in it), the history of earlier runs
(benchmarks/history.json) and the headline table of README.md and docs/index.md.

benchmarks/history.json holds, per results file, one record per version of it: the date it
was recorded, its SHA-256 and its headline values (docs/gen/benchmarks.toml names them).
`make docs` appends a record, dated today, when a results file changed; the docs test fails
until it has, so every page says when its numbers were measured.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = ROOT / "benchmarks" / "history.json"
SPEC = Path(__file__).with_name("benchmarks.toml")

# Keys that say what machine and software measured, shown once at the top of a page.
MACHINE_KEYS = (
    "cpu",
    "machine",
    "platform",
    "cores",
    "cpus",
    "threads",
    "torch_threads",
    "device",
    "backend",
    "world_size",
)
VERSION_KEYS = (
    "python",
    "torch",
    "numpy",
    "transformers",
    "accelerate",
    "lm_eval",
    "trl",
    "datasets",
    "datasketch",
    "xxhash",
    "tiktoken",
    "tokenizers",
    "rustbpe",
    "better-profanity",
    "alt-profanity-check",
)
HIDDEN = re.compile(r"target|^met$|_met$|^source$|^out$|^quick$")
# A results file's "targets" section holds the ratios the benchmark is about, beside what they
# were held to: the page shows it as "ratios", the ratios only.
RATIOS_SECTION = ("targets", "targets_met")
TARGET_NOTE = re.compile(r"\s*\(target[^)]*\)")


def spec() -> dict:
    return tomllib.loads(SPEC.read_text())


def results_files() -> list[Path]:
    """The results files in benchmarks.toml's order, any it does not list after them."""
    order = {stem: i for i, stem in enumerate(spec())}
    return sorted(RESULTS.glob("*.json"), key=lambda p: (order.get(p.stem, len(order)), p.stem))


def page_name(stem: str, entry: dict) -> str:
    return entry.get("page", stem)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def updated_history(today: str | None = None) -> dict:
    """history.json with a record appended for every results file that changed since its last
    record (dated `today`)."""
    history = json.loads(HISTORY.read_text()) if HISTORY.exists() else {}
    entries = spec()
    for path in results_files():
        records = history.setdefault(path.stem, [])
        digest = sha256(path)
        if not records or records[-1]["sha256"] != digest:
            data = json.loads(path.read_text())
            records.append(
                {
                    "date": today or datetime.date.today().isoformat(),
                    "sha256": digest,
                    "headline": headline_values(data, entries.get(path.stem, {})),
                }
            )
    return {k: history[k] for k in sorted(history)}


def history_text(history: dict) -> str:
    return json.dumps(history, indent=1, ensure_ascii=False) + "\n"


def headline_values(data: dict, entry: dict) -> dict:
    out = {}
    for label, *path in entry.get("headline", []):
        if "/" in path:  # a ratio of two values of the file
            cut = path.index("/")
            top, bottom = lookup(data, path[:cut]), lookup(data, path[cut + 1 :])
            ok = isinstance(top, (int, float)) and isinstance(bottom, (int, float)) and bottom
            value = top / bottom if ok else None
        else:
            value = lookup(data, path)
        if value is not None:
            out[label] = value
    return out


def lookup(data: Any, path: list[str]) -> Any:
    for key in path:
        if key == "#" and isinstance(data, list):
            return len(data)
        if isinstance(data, list) and "=" in key:
            wanted = dict(part.split("=", 1) for part in key.split("&"))
            data = next(
                (
                    r
                    for r in data
                    if isinstance(r, dict) and all(str(r.get(k)) == v for k, v in wanted.items())
                ),
                None,
            )
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        elif isinstance(data, dict) and key in data:
            data = data[key]
        else:
            return None
    return data


def render_pages(history: dict) -> dict[str, str | bytes]:
    """Every generated file under docs/benchmarks/, by path relative to the repository."""
    entries = spec()
    pages: dict[str, str | bytes] = {}
    index = [
        "# Benchmarks",
        "",
        "<!-- Generated from benchmarks/results/*.json by docs/gen/gen_bench.py (`make docs`). "
        "Do not edit. -->",
        "",
        "Each script in `benchmarks/` measures lmforge and its reference side by side in one "
        "run, on one machine, and writes what it measured to `benchmarks/results/NAME.json`. "
        "Each page below is rendered from one such file, so every number on it is the file's; "
        "ratios compare the two sides of the same run. `make bench` installs the references "
        "(the `bench` extra) and runs them all; a page's own command reruns one.",
        "",
        "| benchmark | recorded | machine | headline |",
        "|---|---|---|---|",
    ]
    for path in results_files():
        entry = entries.get(path.stem, {})
        data = json.loads(path.read_text())
        name = page_name(path.stem, entry)
        records = history.get(path.stem, [])
        pages[f"docs/benchmarks/{name}.md"] = _page(path, data, entry, records)
        first = next(iter(headline_values(data, entry).items()), None)
        headline = f"{_cell(first[0])}: **{fmt(first[1], first[0])}**" if first else ""
        title = entry.get("title", path.stem)
        date = records[-1]["date"] if records else "unrecorded"
        index.append(f"| [{title}]({name}.md) | {date} | {_cell(_machine(data))} | {headline} |")
        if entry.get("image"):
            pages[f"docs/benchmarks/{entry['image']}"] = (RESULTS / entry["image"]).read_bytes()
    index += ["", "Earlier runs of every benchmark: [history](history.md).", ""]
    pages["docs/benchmarks/index.md"] = "\n".join(index)
    pages["docs/benchmarks/history.md"] = _history_page(history, entries)
    return pages


def headline_table(history: dict, link_prefix: str) -> str:
    """The front page's table: the first headline of each `readme = true` benchmark."""
    entries = spec()
    rows = ["| benchmark | result | recorded on |", "|---|---|---|"]
    for path in results_files():
        entry = entries.get(path.stem, {})
        if not entry.get("readme"):
            continue
        data = json.loads(path.read_text())
        values = headline_values(data, entry)
        if not values:
            continue
        label, value = next(iter(values.items()))
        date = history.get(path.stem, [{}])[-1].get("date", "")
        link = f"{link_prefix}{page_name(path.stem, entry)}.md"
        rows.append(
            f"| [{_short_title(entry)}]({link}) | {_cell(label)}: **{fmt(value, label)}** | "
            f"{_cell(_machine(data))}, {date} |"
        )
    return "\n".join(rows) + "\n"


def nav_entries() -> str:
    """The benchmark pages' entries in mkdocs.yml's nav, in the index's order."""
    entries = spec()
    lines = []
    for path in results_files():
        entry = entries.get(path.stem, {})
        title = _short_title(entry) or path.stem
        lines.append(f"      - {json.dumps(title)}: benchmarks/{page_name(path.stem, entry)}.md")
    lines.append('      - "History": benchmarks/history.md')
    return "\n".join(lines) + "\n"


def _short_title(entry: dict) -> str:
    return entry.get("short") or entry.get("title", "").split(":")[0]


def _page(path: Path, data: dict, entry: dict, records: list) -> str:
    title = entry.get("title", path.stem)
    script = entry.get("script") or _script_for(path.name)
    out = [
        f"# {title}",
        "",
        f"<!-- Generated from benchmarks/results/{path.name} by docs/gen/gen_bench.py "
        "(`make docs`). Do not edit. -->",
        "",
    ]
    about = _method(script)
    if about:
        out += ["## What it measures", "", about, ""]
    out += ["## Where it ran", ""]
    date = records[-1]["date"] if records else "unrecorded"
    out.append(f"- **recorded**: {date} (`benchmarks/results/{path.name}`)")
    machine = _machine(data)
    if machine:
        out.append(f"- **machine**: {machine}")
    versions = _versions(data)
    if versions:
        out.append(f"- **versions**: {versions}")
    if script:
        command = script if " " in script else f"python {script}"
        out.append(f"- **rerun**: `{command}`")
    out.append("")
    values = headline_values(data, entry)
    if values:
        out += ["## Headline", "", "| | |", "|---|---|"]
        out += [f"| {_cell(k)} | **{fmt(v, k)}** |" for k, v in values.items()]
        out.append("")
    if entry.get("image"):
        out += [f"![{title}]({entry['image']})", ""]
    out += ["## Results", ""]
    hide = set(entry.get("hide", ()))
    body = _render(data, hide, level=3, top=True)
    out += body or ["Nothing beyond the above."]
    if len(records) > 1:
        out += ["", "## Earlier runs", ""]
        out += _history_rows(records)
    return "\n".join(out).rstrip() + "\n"


def _history_page(history: dict, entries: dict) -> str:
    out = [
        "# History of the benchmarks",
        "",
        "<!-- Generated from benchmarks/history.json by docs/gen/gen_bench.py (`make docs`). "
        "Do not edit. -->",
        "",
        "Every version of every results file, with the headline values it held: how each "
        "measurement moved as lmforge changed. Dates are when the file was written; the newest "
        "is on the benchmark's own page. `benchmarks/history.json` is the record.",
        "",
    ]
    for stem, records in history.items():
        entry = entries.get(stem, {})
        name = page_name(stem, entry)
        out += [f"## [{entry.get('title', stem)}]({name}.md)", ""]
        out += [*_history_rows(records), ""]
    return "\n".join(out).rstrip() + "\n"


def _history_rows(records: list) -> list[str]:
    labels: list[str] = []
    for r in records:
        labels += [k for k in r["headline"] if k not in labels]
    if not labels:
        return ["| recorded |", "|---|"] + [f"| {r['date']} |" for r in reversed(records)]
    rows = ["| recorded | " + " | ".join(_cell(k) for k in labels) + " |"]
    rows.append("|---" * (len(labels) + 1) + "|")
    for r in reversed(records):
        cells = [fmt(r["headline"][k], k) if k in r["headline"] else "" for k in labels]
        rows.append(f"| {r['date']} | " + " | ".join(cells) + " |")
    return rows


def _script_for(filename: str) -> str:
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if f"results/{filename}" in script.read_text():
            return f"benchmarks/{script.name}"
    return ""


def _method(script: str) -> str:
    """The script's docstring, without its targets and its usage lines."""
    path = ROOT / script
    if not script.endswith(".py") or not path.exists():
        return ""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraphs = []
    for para in doc.split("\n\n"):
        if para.startswith("    ") or para.lstrip().startswith(("python ", ".venv/")):
            continue  # the usage lines: the page's rerun line says it
        text = _scrub(para)
        if text.strip():
            paragraphs.append(_md_paragraph(text.strip()))
    return "\n\n".join(paragraphs)


PLANNING = r"\b(targets?|issues?|issue's|sessions?)\b"


def _scrub(text: str) -> str:
    """A docstring paragraph without what belongs to the work's planning (targets, issues):
    the parentheses, clauses and sentences that name them. Code spans are left alone."""
    spans: list[str] = []

    def hide(match: re.Match) -> str:
        spans.append(match.group(0))
        return f"\0{len(spans) - 1}\0"

    text = re.sub(r"`[^`]*`", hide, text)
    text = re.sub(rf"\s*\([^()]*{PLANNING}[^()]*\)", "", text)
    text = re.sub(r",\s*the issue's [^;.),]*", "", text)
    text = re.sub(r"\bTargets?\b.*?(?:(?<!\d)\.(?!\d)\s*|$)", "", text, flags=re.DOTALL)
    parts = re.split(r"(?<=[.;])(\s+)", text)
    text = "".join(p for p in parts if not re.search(PLANNING, p, re.IGNORECASE))
    return re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], text)


def _md_paragraph(text: str) -> str:
    """A docstring paragraph as Markdown: list items stay lists, wrapped lines join."""
    lines = text.splitlines()
    if any(re.match(r"\s*([-*]|\(\w\)|\d\.)\s", line) for line in lines):
        out = []
        for line in lines:
            if re.match(r"\s*([-*]|\(\w\)|\d\.)\s", line):
                item = re.sub(r"^\s*([-*]|\(\w\)|\d\.)\s+", "", line)
                out.append(f"- {_escape(item)}")
            elif out and out[-1].startswith("- "):
                out[-1] += " " + _escape(line.strip())
            else:
                out.append(_escape(line.strip()))
        # a lead-in line before the list needs a blank line after it
        text = ""
        for i, line in enumerate(out):
            if i and line.startswith("- ") and not out[i - 1].startswith("- "):
                text += "\n"
            text += line + "\n"
        return text.rstrip()
    return _escape(" ".join(line.strip() for line in lines))


def _machine(data: dict) -> str:
    found = _collect(data, MACHINE_KEYS)
    parts = []
    for key, value in found.items():
        if key in ("cpu", "machine", "platform", "device", "backend"):
            parts.append(str(value))
        else:
            noun = key.replace("_", " ")
            parts.append(f"{fmt(value)} {noun.removesuffix('s') if value == 1 else noun}")
    return ", ".join(parts)


def _versions(data: dict) -> str:
    found = _collect(data, VERSION_KEYS)
    return ", ".join(f"{k} {v}" for k, v in found.items())


def _collect(data: dict, keys: tuple) -> dict:
    found = {}
    places = [data] + [
        data[k] for k in ("setup", "machine", "versions") if isinstance(data.get(k), dict)
    ]
    for key in keys:
        for place in places:
            if key in place and not isinstance(place[key], (dict, list)):
                found[key] = place[key]
                break
    return found


def _render(obj: Any, hide: set, level: int, top: bool = False, title: str = "") -> list[str]:
    """Markdown for one node of the results: scalars as a two-column table, a dict of records
    or a list of records as one table, anything deeper as a section per key."""
    out: list[str] = []
    if isinstance(obj, list):
        rows = [r for r in obj if isinstance(r, dict)]
        if rows:
            return _records_table([(None, r) for r in rows], hide)
        return [_cell(_list_cell(obj))] if obj else []
    scalars, sections = [], []
    for key, value in obj.items():
        if key in RATIOS_SECTION and isinstance(value, dict) and "ratios" not in obj:
            key, value = "ratios", _measured(value)
        if _hidden(key, hide) or (top and key in MACHINE_KEYS + VERSION_KEYS):
            continue
        if top and key in ("setup", "machine", "versions") and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in MACHINE_KEYS + VERSION_KEYS}
            if not value:
                continue
        if isinstance(value, dict) or (
            isinstance(value, list) and value and isinstance(value[0], dict)
        ):
            sections.append((key, value))
        elif isinstance(value, list) and len(value) > 8:
            continue  # raw repetitions: the medians and ratios beside them say it
        else:
            scalars.append((key, value))
    if scalars:
        out += ["| | |", "|---|---|"]
        out += [f"| {_cell(_key(k))} | {_value_cell(v, k)} |" for k, v in scalars]
        out.append("")
    for key, value in sections:
        heading = "#" * min(level, 6) + " " + _cell(_key(key))
        if isinstance(value, dict) and _is_records(value, hide):
            table = _records_table(list(value.items()), hide)
            if table:
                out += [heading, "", *table, ""]
        else:
            inner = _render(value, hide, level + 1)
            if inner:
                out += [heading, "", *inner, ""]
    return out


def _measured(section: dict) -> dict:
    """A targets section without what it was held to: the statements, the thresholds, the
    verdicts; what is left is measured."""
    out = {}
    for key, value in section.items():
        if isinstance(value, dict):
            inner = _measured(value)
            if inner:
                out[key] = inner
        elif not isinstance(value, str) and not HIDDEN.search(str(key)):
            out[key] = value
    return out


def _is_records(value: dict, hide: set) -> bool:
    """A dict whose values are all dicts of scalars (after flattening one level)."""
    inner = [v for k, v in value.items() if not _hidden(k, hide)]
    return (
        bool(inner)
        and all(isinstance(v, dict) for v in inner)
        and all(
            all(
                not isinstance(x, dict) or all(not isinstance(y, (dict, list)) for y in x.values())
                for x in v.values()
            )
            for v in inner
        )
    )


def _records_table(rows: list, hide: set) -> list[str]:
    flat = [(name, _flatten(r, hide)) for name, r in rows if not (name and _hidden(name, hide))]
    columns: list[str] = []
    for _, r in flat:
        columns += [c for c in r if c not in columns]
    if not columns:
        return []
    named = any(name is not None for name, _ in flat)
    head = ([""] if named else []) + [_key(c) for c in columns]
    out = ["| " + " | ".join(_cell(h) for h in head) + " |", "|---" * len(head) + "|"]
    for name, r in flat:
        cells = ([f"**{_cell(_key(name))}**"] if named else []) + [
            _value_cell(r[c], c) if c in r else "" for c in columns
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _flatten(record: dict, hide: set, prefix: str = "") -> dict:
    out = {}
    for key, value in record.items():
        if _hidden(key, hide):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, hide, name + " "))
        elif isinstance(value, list) and (
            len(value) > 8 or any(isinstance(v, (dict, list)) for v in value)
        ):
            continue
        else:
            out[name] = value
    return out


def _hidden(key: str, hide: set) -> bool:
    return key in hide or bool(HIDDEN.search(str(key)))


def _key(key: Any) -> str:
    return TARGET_NOTE.sub("", str(key)).replace("_", " ")


def _list_cell(values: list) -> str:
    return ", ".join(fmt(v) for v in values)


def _value_cell(value: Any, key: str = "") -> str:
    if isinstance(value, list):
        return _cell(_list_cell(value))
    return _cell(fmt(value, key))


def fmt(value: Any, key: str = "") -> str:
    """A number as the pages print it: ratios with ×, counts with thousands separators, the
    rest to four significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        key = str(key).replace("_", " ")
        if not math.isfinite(value):
            return str(value)
        if (
            re.search(r"\bvs\b|ratio|speedup", key)
            or (re.search(r"\bover\b|/", key) and "bits per byte" not in key)
        ) and 0.01 < abs(value) < 1000:
            return f"{value:.2f}×" if abs(value) >= 0.1 else f"{value:.2g}×"
        if abs(value) >= 1e5:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        if value == 0:
            return "0"
        if abs(value) < 1e-3:
            return f"{value:.2e}"
        return f"{value:.4g}"
    return str(value)


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _cell(text: str) -> str:
    return _escape(" ".join(str(text).split())).replace("|", "\\|")


def backfill_history() -> dict:
    """history.json rebuilt from git: one record per commit that changed a results file, dated
    by the commit (run once, where the repository's history is at hand)."""
    import subprocess

    entries = spec()
    history: dict = {}
    for path in results_files():
        rel = path.relative_to(ROOT).as_posix()
        log = subprocess.run(
            ["git", "log", "--reverse", "--format=%H %cs", "--", rel],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        records = history.setdefault(path.stem, [])
        for line in filter(None, log):
            commit, date = line.split()
            blob = subprocess.run(
                ["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, check=True
            ).stdout
            digest = hashlib.sha256(blob).hexdigest()
            if records and records[-1]["sha256"] == digest:
                continue
            try:
                data = json.loads(blob)
            except ValueError:
                continue
            records.append(
                {
                    "date": date,
                    "sha256": digest,
                    "headline": headline_values(data, entries.get(path.stem, {})),
                }
            )
    return {k: history[k] for k in sorted(history)}
