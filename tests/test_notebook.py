"""The quickstart notebook runs headlessly end to end (so it never rots)."""
import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT


@pytest.mark.slow  # a whole training run in a kernel; the API it uses is the default suite's
@pytest.mark.timeout(900)
def test_quickstart_notebook_executes():
    path = os.path.join(ROOT, "examples", "quickstart.ipynb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute()
    outputs = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                        for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert "compilations after warmup: 0" in outputs
    assert "'all-gather'" in outputs and "per-device bytes" in outputs
