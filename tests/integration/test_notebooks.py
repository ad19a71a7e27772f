"""The notebooks execute end to end (small settings), on copies: the committed files stay as they are.

Each notebook runs in a fresh kernel with ``SMIEXLM_NOTEBOOK_FAST=1``. When the default model is
not installed, a randomly initialised tiny ExLM checkpoint stands in for it through
``SMIEXLM_NOTEBOOK_CHECKPOINT`` (the notebooks' code paths are the same either way).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = [
    "01_embeddings_quickstart",
    "02_property_prediction",
    "03_exlm_case_study",
    "04_trustworthy_predictions",
    "05_potency_table",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path | None:
    """None when the shipped default model exists, else a random tiny ExLM folder."""
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR

    if (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        return None
    import torch

    from smiexlm import ExLMConfig, ExLMModel, SmilesTokenizer

    torch.manual_seed(0)
    tok = SmilesTokenizer()
    cfg = ExLMConfig.tiny(vocab_size=tok.vocab_size, objective="exlm", vocab_hash=tok.vocab_hash)
    directory = tmp_path_factory.mktemp("tiny_exlm")
    ExLMModel(cfg).save_pretrained(directory, tokenizer=tok)
    return directory


def test_notebooks_are_stored_with_outputs():
    """A reader on a code host sees the plots: every notebook keeps its executed outputs."""
    for name in NAMES:
        path = NOTEBOOKS / f"{name}.ipynb"
        book = nbformat.read(path, as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert code and all(c.execution_count for c in code), f"{name} is not executed"
        kinds = {k for c in code for o in c.outputs for k in o.get("data", {})}
        assert "image/png" in kinds, f"{name} has no stored figure"
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{name} was stored with an error output"
        assert path.stat().st_size < 1_500_000, f"{name} is over 1.5 MB"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes(name, shared_data, checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SMIEXLM_NOTEBOOK_FAST", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws figures
    if checkpoint is not None:
        monkeypatch.setenv("SMIEXLM_NOTEBOOK_CHECKPOINT", str(checkpoint))
    else:
        monkeypatch.delenv("SMIEXLM_NOTEBOOK_CHECKPOINT", raising=False)
    copy = tmp_path / f"{name}.ipynb"
    shutil.copy(NOTEBOOKS / f"{name}.ipynb", copy)
    book = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was produced"
    text = json.dumps([o.get("text", "") for o in outputs])
    assert "Traceback" not in text
