"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing page or
image, a page left out of the navigation, or a Python API reference to a name that does not
exist fails it."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    problems = [
        line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))
    ]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems or result.stderr.splitlines()[-20:]
    )
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
