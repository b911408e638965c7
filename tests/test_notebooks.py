"""The notebooks run top to bottom with nbclient against the real demo store, and write their plots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

NOTEBOOKS = REPO_ROOT / "notebooks"
PLOTS = {
    "triage": ["incident_timeline.png", "xid_ecc_history.png", "straggler_heatmap.png",
               "hang_divergent_collective.png"],
    "goodput": ["ettr_over_time.png", "badput_by_cause.png", "incident_cost.png", "expected_ettr.png"],
}


def execute(name: str, store: Path, out: Path, timeout: int = 180):
    """Run notebooks/<name>.ipynb in a fresh kernel (cwd notebooks/) against `store`; plots go under `out`.
    Returns the executed notebook."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    env = {"FAULTLENS_STORE": str(store), "FAULTLENS_NOTEBOOK_OUT": str(out), "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                         resources={"metadata": {"path": str(NOTEBOOKS)}})
        client.execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return notebook


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_runs_and_writes_its_plots(name, demo_store, tmp_path):
    notebook = execute(name, demo_store.store, tmp_path)
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= len(PLOTS[name])
    for plot in PLOTS[name]:
        path = tmp_path / name / plot
        assert path.is_file(), plot
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, plot


def test_a_notebook_error_fails_the_run(tmp_path):
    """The check above can fail: a store without the job's tables makes the first query cell raise."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        execute("goodput", tmp_path / "empty", tmp_path / "out", timeout=60)
