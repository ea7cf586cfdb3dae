"""Run reports: Markdown with the numbers that matter and PNG plots."""

from lmforge.report.plots import plot_loss
from lmforge.report.report import ReportData, Sample, render, write_report

__all__ = ["ReportData", "Sample", "plot_loss", "render", "write_report"]
