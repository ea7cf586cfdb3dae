"""The tutorials, the concept pages and getting started work as written.

Every page of the site, in `make test`: each `lmforge` command in its shell blocks parses with
lmforge's own parser and each Python block compiles (seconds for all of them). Then every shell
and Python block runs, in order, at its smallest scale (tests/docs/runner.py says how): the
pages in `IN_MAKE_TEST` in `make test`, the others in `make docs-check`
(LMFORGE_DOCS_CHECK=1), which CI runs after `make test`.
"""

import os
import shutil
from pathlib import Path

import pytest
import runner

PAGES = runner.pages()
NAMES = [str(p.relative_to(runner.DOCS)) for p in PAGES]

# Pages quick enough for `make test`'s time budget (each under 20 s on a quiet 2-core machine,
# Zen 3 included); the rest train or serve models for longer and run in `make docs-check`, which
# runs every page, these too.
IN_MAKE_TEST = {"tutorials/web-crawl.md", "concepts/kv-cache.md"}
# Outside `make docs-check` (LMFORGE_DOCS_CHECK=1), conftest.py leaves the other pages out.


@pytest.mark.parametrize(
    "page", runner.every_page(), ids=[str(p.relative_to(runner.DOCS)) for p in runner.every_page()]
)
def test_commands_parse(page):
    errors = []
    for block in runner.parse(page.read_text()):
        errors += runner.command_errors(block)
    assert not errors, f"{page.relative_to(runner.ROOT)}:\n" + "\n".join(errors)


@pytest.fixture(scope="session")
def docs_cache(tmp_path_factory):
    """One LMFORGE_CACHE for every page a worker runs: the built-in corpus is prepared once.
    This CPU's measured matmul peaks are copied in from the user's cache where it has them
    (keyed by processor, threads and torch version), as a reader's machine would have them."""
    cache = tmp_path_factory.mktemp("docs-cache")
    home = Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))
    peaks = home / "peak_flops.json"
    if peaks.is_file():
        shutil.copyfile(peaks, cache / "peak_flops.json")
    return cache


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("page", PAGES, ids=NAMES)
def test_page_runs(page, tmp_path, docs_cache):
    name = str(page.relative_to(runner.DOCS))
    ran = runner.run_page(page, tmp_path / "page", docs_cache)
    print(f"{name}: {len(ran)} blocks, {sum(r.seconds for r in ran):.1f} s")
