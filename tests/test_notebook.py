"""notebooks/analyze_study.ipynb runs top to bottom against a study made in this test session."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_report import tuned_output

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analyze_study.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"


@pytest.mark.slow
def test_analyze_study_notebook_runs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                                     tmp_path: Path, triton_install) -> None:
    output_dir = tuned_output(tmp_path_factory)  # a real `tuner tune` study, shared with test_report.py
    monkeypatch.setenv("TUNER_STUDY_DIR", str(output_dir))  # the kernel inherits the environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"study output: {output_dir.resolve()}" in text
    assert "Recommended: max_batch_size=" in text
    plots = [o for o in outputs if o.output_type == "display_data" and PLOTLY in o.get("data", {})]
    assert len(plots) >= 6
    tables = [o for o in outputs if "text/html" in o.get("data", {}) and "<table" in o["data"]["text/html"]]
    assert len(tables) >= 5
