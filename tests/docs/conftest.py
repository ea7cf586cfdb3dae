"""The docs tests import the runner beside them and the generators in docs/gen/."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[1] / "docs" / "gen"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
