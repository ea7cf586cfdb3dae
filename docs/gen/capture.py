"""Run documentation pages as written on this machine and record what the blocks they show
printed (`<!-- generated:output-K -->`) in docs/gen/page_outputs.json, with the machine, the
date and the versions; `python docs/gen/generate.py` then renders them into the pages.

    python docs/gen/capture.py                       # every page that shows an output
    python docs/gen/capture.py docs/concepts/mfu.md  # one page

Run it on a quiet machine: the outputs are measurements.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_outputs  # noqa: E402
from gen_outputs import runner  # noqa: E402

from lmforge import atomic  # noqa: E402


def machine() -> str:
    import torch

    from lmforge.device.peak import processor_name

    return f"{processor_name(torch.device('cpu'))}, {os.cpu_count()} cores"


def capture(page: Path, root: Path) -> dict[str, dict]:
    """The output of each block `page` shows, run as written."""
    import torch

    import lmforge

    ran = runner.run_page(page, root / page.stem, root / "cache", log=print, as_written=True)
    outputs = [r.output for r in ran if not r.skipped]
    stamp = {
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
        "lmforge": lmforge.__version__,
        "torch": torch.__version__.split("+")[0],
        "python": platform.python_version(),
    }
    return {
        str(k): {
            **stamp,
            "code": gen_outputs.code_hash(block),
            "output": outputs[k - 1],
        }
        for k, block in gen_outputs.wanted(page).items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path)
    args = parser.parse_args()
    pages = [p.resolve() for p in args.pages] or gen_outputs.marked_pages()
    captured = gen_outputs.load()
    root = Path(tempfile.mkdtemp(prefix="lmforge-capture-"))
    for page in pages:
        captured["pages"][gen_outputs.rel(page)] = capture(page, root)
        atomic.write_json(gen_outputs.OUTPUTS, captured)
        print(f"captured {gen_outputs.rel(page)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
