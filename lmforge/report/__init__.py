"""Run reports: Markdown with the numbers that matter and PNG plots.

Names import their module (and matplotlib) on first use.
"""

from lmforge.lazy import lazy_exports

_EXPORTS = {
    "plot_loss": "lmforge.report.plots",
    "ReportData": "lmforge.report.report",
    "Sample": "lmforge.report.report",
    "render": "lmforge.report.report",
    "write_report": "lmforge.report.report",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
