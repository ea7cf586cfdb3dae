"""The generated documentation is current: the CLI and config references, the benchmark pages
and their history, the results tables of README.md and docs/index.md, the layers of
docs/architecture.md and the benchmarks' entries in mkdocs.yml are what docs/gen/generate.py
makes of the code and the results files today."""

import generate


def test_generated_docs_are_current():
    stale = generate.stale(generate.outputs())
    assert not stale, (
        "generated docs are stale: " + ", ".join(stale) + "; run `make docs` and commit them"
    )


def test_the_cli_reference_has_every_command():
    from lmforge.cli import build_parser

    text = generate.gen_cli.render()
    for name, _, _ in generate.gen_cli._walk(build_parser(), "lmforge"):
        assert f"## `{name}`" in text


def test_the_config_reference_has_every_key_with_its_range():
    import dataclasses

    from lmforge.config import RunConfig

    text = generate.gen_config.render()
    cfg = RunConfig()

    def keys(section, prefix):  # every leaf key, a nested section's (train.optimizer.lr) too
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value):
                assert f"`[{prefix}.{f.name}]`" in text
                yield from keys(value, f"{prefix}.{f.name}")
            else:
                yield f"{prefix}.{f.name}"

    for section in ("model", "tokenizer", "data", "train"):
        for key in keys(getattr(cfg, section), section):
            assert f"`{key}`" in text
    assert "| `train.optimizer.lr` | float | `0.003` | above 0 |" in text
    assert "one of `adamw`, `muon`" in text


def test_benchmark_pages_hold_no_number_but_the_results_files():
    """A headline on a page is the value at its path in the results file, formatted."""
    import json
    import re

    import gen_bench

    history = gen_bench.updated_history("2000-01-01")
    pages = gen_bench.render_pages(history)
    for path in gen_bench.results_files():
        entry = gen_bench.spec().get(path.stem, {})
        data = json.loads(path.read_text())
        page = pages[f"docs/benchmarks/{gen_bench.page_name(path.stem, entry)}.md"]
        for label, value in gen_bench.headline_values(data, entry).items():
            assert f"| **{gen_bench.fmt(value, label)}** |" in page
        prose = re.sub(r"`[^`]*`", "", page)
        assert not re.search(r"\b(targets?|issues?|sessions?)\b", prose, re.IGNORECASE), path


def test_the_readme_is_a_front_page_whose_links_resolve():
    import re
    from pathlib import Path

    root = Path(generate.ROOT)
    text = (root / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is the front page: keep it to 200 lines"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (root / target).exists(), f"README.md links to {target}, which does not exist"


def test_a_page_shows_what_its_block_printed_until_the_block_changes(tmp_path, monkeypatch):
    import gen_outputs
    import pytest

    monkeypatch.setattr(gen_outputs, "DOCS", tmp_path)
    page = tmp_path / "page.md"
    block = "```bash\necho 'predicted 1.0  measured 0.9'\n```\n"
    marker = "<!-- generated:output-1 -->\n<!-- /generated:output-1 -->\n"
    page.write_text("# A page\n\n```text\nnot run\n```\n\n" + block + marker)
    (wanted,) = gen_outputs.wanted(page).values()
    stamp = {"machine": "a CPU, 2 cores", "date": "2026-01-01", "lmforge": "0", "torch": "2"}
    capture = {**stamp, "code": gen_outputs.code_hash(wanted), "output": "predicted 1.0\n"}
    captured = {"pages": {"page.md": {"1": capture}}}

    shown = gen_outputs.blocks(page, captured)["output-1"]
    assert shown.startswith("```text\npredicted 1.0\n```") and "a CPU, 2 cores" in shown

    page.write_text(page.read_text().replace("0.9", "0.8"))
    with pytest.raises(SystemExit, match="changed after its output was captured"):
        gen_outputs.blocks(page, captured)
