"""The study report: one self-contained HTML file with plots, from a `tuner tune` output directory.

    write_report(output_dir) -> Path      report.html in that directory
    write_soak_report(output_dir) -> Path soak/report.html: a soak's windows over time (tuner soak)
    write_reports(output_dir) -> [Path]   both, as far as the directory holds a study and a soak
    write_production_report(audit_json) -> Path  a production audit's hourly series (tuner audit --prometheus --json)
    load_output(output_dir) -> StudyOutput  the same data, for notebooks
    figures.<name>(StudyOutput) -> plotly Figure | None   each of the report's plots
    simulation_table(StudyOutput)         simulated vs measured, when the directory has simulation.csv
"""

from tuner.report import _figures as figures
from tuner.report._html import (
    REPORT,
    comparison_table,
    recommendation_line,
    render,
    simulation_line,
    simulation_table,
    top_table,
    write_report,
)
from tuner.report._load import SIMULATION, StudyOutput, load_output, simulated_vs_measured, traffic_rate
from tuner.report._production import is_production_audit, write_production_report
from tuner.report._soak import SoakView, load_soak, render_soak, write_reports, write_soak_report

__all__ = [
    "REPORT",
    "SIMULATION",
    "SoakView",
    "StudyOutput",
    "comparison_table",
    "figures",
    "is_production_audit",
    "load_output",
    "load_soak",
    "recommendation_line",
    "render",
    "render_soak",
    "simulated_vs_measured",
    "simulation_line",
    "simulation_table",
    "top_table",
    "traffic_rate",
    "write_report",
    "write_production_report",
    "write_reports",
    "write_soak_report",
]
