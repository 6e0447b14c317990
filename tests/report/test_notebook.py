"""notebooks/analysis.ipynb executes top to bottom on the shipped sample run (so it cannot rot)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.slow  # executes a notebook, ~5 s
def test_analysis_notebook_executes_and_draws(monkeypatch):
    monkeypatch.delenv("DSDPROF_RUN", raising=False)
    monkeypatch.delenv("DSDPROF_VALIDATE", raising=False)
    nb = nbformat.read(NOTEBOOKS / "analysis.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) >= 3  # optimal K, heatmap, acceptance (+ tokens/s per user with a validate run)
    assert all(base64.b64decode(p)[:4] == b"\x89PNG" for p in pngs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "ranges:" in text and "shape of K* vs batch size" in text
