"""The notebooks run top to bottom with nbclient against the real demo store, and write their plots.
"""

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
    "triage": [
        "incident_timeline.png",
        "xid_ecc_history.png",
        "straggler_heatmap.png",
        "hang_divergent_collective.png",
    ],
    "goodput": [
        "ettr_over_time.png",
        "badput_by_cause.png",
        "incident_cost.png",
        "expected_ettr.png",
    ],
}


def execute(name: str, store: Path, out: Path, timeout: int = 180):
    """Run notebooks/<name>.ipynb in a fresh kernel (cwd notebooks/) against `store`; plots go under
    `out`. Returns the executed notebook."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    env = {
        "FAULTLENS_STORE": str(store),
        "FAULTLENS_NOTEBOOK_OUT": str(out),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
        ),
    }
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


def _outputs(notebook, kind: str) -> list:
    return [
        o
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
        if o.get("output_type") == kind or kind in o.get("data", {})
    ]


def _check(notebook, out: Path, name: str, plots: list[str]) -> None:
    assert not _outputs(notebook, "error")
    assert len(_outputs(notebook, "image/png")) >= len(plots)
    for plot in plots:
        path = out / name / plot
        assert path.is_file(), plot
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, plot


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_runs_on_the_demo_store_and_writes_its_plots(name, demo_store, tmp_path):
    _check(execute(name, demo_store.store, tmp_path), tmp_path, name, PLOTS[name])


@pytest.fixture(scope="module")
def simulated_store(tmp_path_factory) -> Path:
    """A simulated job (faultlens simulate: 2 nodes x 8 GPUs, 1 hour, Llama-3 fault mix), attributed
    and decided in a batch pass afterwards, as an operator would analyse an old job."""
    from faultlens.controller.cli.main import main

    root = tmp_path_factory.mktemp("simulated")
    store = root / "store"
    assert (
        main(
            [
                "simulate",
                "--store",
                str(store),
                "--nodes",
                "2",
                "--hours",
                "1",
                "--seed",
                "5",
                "--labels",
                str(root / "labels.jsonl"),
            ]
        )
        == 0
    )
    assert main(["attribute", "--store", str(store)]) == 0
    assert main(["decide", "--store", str(store)]) == 0
    return store


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_notebook_runs_on_a_simulated_store(name, simulated_store, tmp_path):
    notebook = execute(name, simulated_store, tmp_path)
    # the simulator writes no checkpoint steps
    plots = [p for p in PLOTS[name] if p != "expected_ettr.png"]
    _check(notebook, tmp_path, name, plots)
    if name == "goodput":
        text = "".join(o.get("text", "") for o in _outputs(notebook, "stream"))
        assert (
            "no checkpoint steps recorded" in text
            and not (tmp_path / name / "expected_ettr.png").exists()
        )


def test_a_notebook_error_fails_the_run(tmp_path):
    """The check above can fail: a store without the job's tables makes the first query cell raise.
    """
    (tmp_path / "empty").mkdir()
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        execute("goodput", tmp_path / "empty", tmp_path / "out", timeout=60)
