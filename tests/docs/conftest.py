"""The docs tests import the runner beside them and the generators in docs/gen/; outside `make
docs-check` the pages that take minutes are left out of the session (not listed as skipped)."""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[1] / "docs" / "gen"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LMFORGE_DOCS_CHECK") == "1":
        return
    from test_pages import IN_MAKE_TEST

    keep, drop = [], []
    for item in items:
        slow = item.originalname == "test_page_runs" and item.callspec.id not in IN_MAKE_TEST
        (drop if slow else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
