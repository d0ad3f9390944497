"""The study report: one self-contained HTML file with plots, from a `tuner tune` output directory.

    write_report(output_dir) -> Path      report.html in that directory
    load_output(output_dir) -> StudyOutput  the same data, for notebooks
    figures.<name>(StudyOutput) -> plotly Figure | None   each of the report's plots
    simulation_table(StudyOutput)         simulated vs measured, when the directory has simulation.csv
"""

from tuner.report import _figures as figures
from tuner.report._html import (
    comparison_table,
    recommendation_line,
    render,
    simulation_line,
    simulation_table,
    top_table,
    write_report,
)
from tuner.report._load import StudyOutput, load_output, simulated_vs_measured, traffic_rate

__all__ = [
    "StudyOutput",
    "comparison_table",
    "figures",
    "load_output",
    "recommendation_line",
    "render",
    "simulated_vs_measured",
    "simulation_line",
    "simulation_table",
    "top_table",
    "traffic_rate",
    "write_report",
]
