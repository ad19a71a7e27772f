"""corpus_tokens.json: which tokens a model's weights were trained on, kept in its folder and
told to whoever embeds or predicts a molecule holding one they were not."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.records import read_corpus_tokens, write_corpus_tokens
from smiexlm.tokenizer import SmilesTokenizer

SALT = "C[C@@H](N)C(=O)[O-].[Na+]"  # stereo, a charge and a counter-ion: none in MOSES


def test_the_record_reads_back_and_refuses_what_is_not_the_folders(tmp_path):
    tok = SmilesTokenizer()
    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    counts[[tok.vocab["C"], tok.vocab["O"]]] = 7, 2
    path = write_corpus_tokens(tmp_path, tok.tokens, counts, "a test corpus")
    doc = json.loads(path.read_text())
    assert doc["counts"] == {"C": 7, "O": 2} and doc["tokens"] == 9  # never-seen left out
    np.testing.assert_array_equal(read_corpus_tokens(tmp_path, tok.vocab), counts)
    assert read_corpus_tokens(tmp_path / "nowhere", tok.vocab) is None
    with pytest.raises(DataError, match="one count per vocabulary token"):
        write_corpus_tokens(tmp_path, tok.tokens, counts[:-1], "short")
    for counts_doc, error, match in (({"Xx9": 1}, DataError, "'Xx9' is not in the folder's"),
                                     ({"C": -1}, ConfigError, r"counts\['C'\]"),
                                     ({"C": 1.5}, ConfigError, r"counts\['C'\]"),
                                     ([1, 2], DataError, "'counts' to be a JSON object")):  # fmt: skip
        path.write_text(json.dumps(doc | {"counts": counts_doc}))
        with pytest.raises(error, match=match):
            read_corpus_tokens(tmp_path, tok.vocab)
    path.write_text(json.dumps(doc | {"format": "other/1"}))
    with pytest.raises(DataError, match="format 'other/1'"):
        read_corpus_tokens(tmp_path, tok.vocab)


def test_the_default_models_record_matches_the_embeddings_it_trained():
    """Independent of the corpus: an embedding row no update touched keeps its initial scale
    (about 0.02 * sqrt(128) = 0.23), every trained one has grown well past it."""
    from safetensors.numpy import load_file

    folder = ModelFolder()
    weights = load_file(str(folder.path / "model.safetensors"))["embed.weight"]
    norms = np.linalg.norm(weights.astype(np.float32), axis=1)[5:]  # the special tokens aside
    trained = folder.corpus_tokens[5:] > 0
    assert norms[trained].min() > 0.3 and norms[~trained].max() < 0.28


def test_rows_name_their_untrained_tokens_once_each_in_order():
    inputs = ModelFolder().inputs()
    rows, _ = inputs.rows(["CCO", SALT, "[O-]C(=O)[C@@H](C)N.[Na+]"])
    assert inputs.unseen(rows) == [[], ["[C@@H]", "[O-]", ".", "[Na+]"], ["[O-]", "[C@@H]", ".", "[Na+]"]]  # fmt: skip
    inputs.corpus_counts = None  # a folder without the record: nothing can be said
    assert inputs.unseen(rows) is None


def test_featurize_reports_and_warns_of_molecules_with_untrained_tokens(caplog):
    from smiexlm import Featurizer

    feat = Featurizer.from_pretrained()
    with caplog.at_level(logging.WARNING, logger="smiexlm.embedding.featurizer"):
        feat.featurize(["CCO", SALT, "c1ccccc1[N+](=O)[O-]", "xx"], errors="nan")
    report = feat.last_report
    assert (report.unseen.molecules, report.unseen.holding) == (3, 2)
    assert report.unseen.tokens["[O-]"] == 2 and report.unseen.tokens["[Na+]"] == 1
    assert "2 with tokens the model never trained" in report.summary()
    assert "2 of 3 molecules hold tokens absent" in caplog.text and "[O-] (2)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smiexlm.embedding.featurizer"):
        feat.featurize(["CCO", "c1ccccc1"])
    assert feat.last_report.unseen.holding == 0 and not caplog.text


def test_cli_records_a_folders_corpus_and_lists_what_it_never_trained(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from smiexlm.cli.main import app

    folder = tmp_path / "model"
    shutil.copytree(ModelFolder().path, folder)
    (folder / "corpus_tokens.json").unlink()
    result = CliRunner().invoke(app, ["vocab", "corpus", str(folder)])
    assert result.exit_code != 0 and "give --data" in str(result.exception)
    shutil.copy(ModelFolder().path / "corpus_tokens.json", folder)
    result = CliRunner().invoke(app, ["vocab", "corpus", str(folder)])
    assert result.exit_code == 0, result.output
    assert "23 of 328 tokens occurred" in result.output and "[Na+]" in result.output
    never = result.output.split("never trained (305): ")[1].split()
    assert "C" not in never and "[MASK]" not in never and len(never) == 305
    shipped = ModelFolder().path / "corpus_tokens.json"
    before = shipped.read_bytes()
    for name in ("default", str(ModelFolder().path)):  # the shipped models are read-only
        result = CliRunner().invoke(app, ["vocab", "corpus", name, "--data", str(tmp_path)])
        assert result.exit_code != 0 and "read-only" in str(result.exception)
    assert shipped.read_bytes() == before


def test_predict_says_which_molecules_were_cut_and_which_tokens_no_training_held(tmp_path):
    """Fine-tuning trains the tokens of its training molecules too: the folder it saves
    records the backbone's corpus plus those, counted here by hand."""
    import pandas as pd

    from smiexlm.moleculenet.splits import make_split
    from smiexlm.serving.prediction import predict
    from tests.unit.finetuning.test_moleculenet_finetune import _finetune_cli

    smiles = [f"C{'C' * n}{tail}" for n in range(1, 16) for tail in ("O", "[NH3+]")]
    path = tmp_path / "charged.csv"
    pd.DataFrame({"smi": smiles, "y": [i % 2 for i in range(len(smiles))]}).to_csv(path, index=False)  # fmt: skip
    result = _finetune_cli(path, tmp_path / "out", "--seeds", "0", "--save-dir", str(tmp_path / "m"))  # fmt: skip
    assert result.exit_code == 0, result.output
    folder = ModelFolder(tmp_path / "m" / "seed0")
    inputs = folder.inputs()
    train_rows, _ = inputs.rows([smiles[i] for i in make_split(smiles, "random", 0).train])
    by_hand = ModelFolder().corpus_tokens + np.bincount(np.concatenate(train_rows), minlength=len(inputs.tokenizer.tokens))  # fmt: skip
    np.testing.assert_array_equal(folder.corpus_tokens, by_hand)
    assert folder.corpus_tokens[inputs.tokenizer.vocab["[NH3+]"]] > 0  # trained by fine-tuning

    long = "C" * 300  # 302 tokens with BOS and EOS: cut to fine-tuning's 256, as it cut its own
    got = predict(folder.path, ["CCO", SALT, "CC[NH3+]", long, "xx"])
    assert got["truncated"].tolist() == [False, False, False, True, False]
    assert got["untrained_tokens"].tolist() == ["", "[C@@H] [O-] . [Na+]", "", "", ""]
    assert not got["valid"][4] and np.isnan(got["y"][4])
