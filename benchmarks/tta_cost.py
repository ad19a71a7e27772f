"""What test-time augmentation, the applicability domain and a forest beside the model cost
per molecule: ``predict`` with K random SMILES against none, with the domain columns against
without, and with a forest blended in.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/tta_cost.py --n 1000 --tta 0 4 10 --train 1631 --forest rdkit2d both

A fine-tuned folder is made from the shipped default (a regression head, untrained: the cost
does not depend on the weights), then ``predict`` scores the first N BBBP molecules with each
K. Process CPU time per molecule (one thread), the ratio to K = 0, and the mean spread
(``<label>_tta_std``) are printed as a Markdown table. With ``--train M`` the same folder is
also given a reference of M training molecules (BBBP's last M, their embeddings from the
same model), so that K = 0 is timed again with the five domain columns (ECFP4 and embedding
neighbours among M molecules). Each ``--forest KIND`` (with ``--train``) then gives the folder
the forest ``finetune --forest KIND`` keeps (``--forest-trees``, 500; fitted on the M
molecules' BBBP labels as values) and times K = 0 once more, domain and blend included.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--tta", type=int, nargs="+", default=[0, 4, 10])
    parser.add_argument("--train", type=int, default=0, help="training molecules of a domain")
    parser.add_argument("--forest", nargs="*", default=[], help="forest kinds to time (--train)")
    parser.add_argument("--forest-trees", type=int, default=500)
    args = parser.parse_args()
    if args.forest and not args.train:
        parser.error("--forest needs --train (the molecules the forest is fitted on)")

    import torch

    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
    from smiexlm.moleculenet import load_task
    from smiexlm.serving.prediction import predict
    from smiexlm.tokenizer import SmilesTokenizer

    torch.set_num_threads(1)
    smiles = load_task("bbbp").smiles[: args.n]
    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(DEFAULT_MODEL_DIR), 1, "regression", 0.0, "cls"
    )
    meta = {"task_type": "regression", "n_outputs": 1, "pooling": "cls", "label_cols": ["y"],
            "target_mean": [0.0], "target_std": [1.0], "config": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_finetuned(model, SmilesTokenizer.load(DEFAULT_MODEL_DIR / "vocab.json"),
                                Path(tmp) / "model", meta)  # fmt: skip
        predict(folder, smiles[:50])  # warm up: imports, first allocations
        rows, base = [], None
        for k in args.tta:
            start = time.process_time()
            frame = predict(folder, smiles, tta=k)
            ms = 1000 * (time.process_time() - start) / len(smiles)
            base = base or ms
            spread = frame["y_tta_std"].mean() if k else 0.0
            rows.append(f"| {k} | {ms:.2f} | {ms / base:.1f}x | {spread:.4f} |")
        if args.train:
            _add_reference(folder, load_task("bbbp").smiles[-args.train :])
            start = time.process_time()
            frame = predict(folder, smiles)
            ms = 1000 * (time.process_time() - start) / len(smiles)
            assert "in_domain" in frame.columns
            rows.append(f"| 0, with the domain of {args.train} | {ms:.2f} | {ms / base:.1f}x | – |")
        for kind in args.forest:
            task = load_task("bbbp")
            _add_forest(folder, task.smiles[-args.train :], task.labels[-args.train :], kind,
                        args.forest_trees)  # fmt: skip
            start = time.process_time()
            frame = predict(folder, smiles)
            ms = 1000 * (time.process_time() - start) / len(smiles)
            assert "y_forest" in frame.columns
            rows.append(f"| 0, with the domain and a forest on {kind} ({args.forest_trees} trees) "
                        f"| {ms:.2f} | {ms / base:.1f}x | – |")  # fmt: skip
    print(f"predict on {len(smiles)} BBBP molecules, one thread\n")
    print("| K random SMILES | CPU ms per molecule | ratio | mean spread |\n|---|---|---|---|")
    print("\n".join(rows))


def _add_reference(folder: Path, train: list[str]) -> None:
    """Give the folder a reference of ``train`` (validation: the first 10 of them)."""
    import numpy as np

    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.modelio.pretrained import load_finetuned
    from smiexlm.trust.reference import Reference

    served, inputs, _ = load_finetuned(folder, device="cpu")
    texts = inputs.texts(train, True)
    rows, _ = inputs.rows(texts, 256)
    pooled = engine_predict(served, Examples(rows, None, None), output="pooled")
    valid = np.zeros((10, 1), dtype=np.float32)
    ref = Reference.build(texts, pooled, texts[:10], pooled[:10], valid, valid, valid)
    record_checksums(folder, ref.save(folder).name)


def _add_forest(folder: Path, train: list[str], labels, kind: str, n_trees: int) -> None:
    """Give the folder the forest of ``kind`` fitted on ``train`` (validation: the first 10,
    as :func:`_add_reference` has it)."""
    import json

    from smiexlm.finetuning.config import FinetuneConfig
    from smiexlm.forests.forest import KeptForest
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.modelio.layout import FINETUNE_NAME
    from smiexlm.modelio.pretrained import load_finetuned

    _, inputs, meta = load_finetuned(folder, device="cpu")
    texts = inputs.texts(train, True)
    cfg = FinetuneConfig(forest=kind, forest_trees=n_trees)
    kept, _ = KeptForest.fit(texts, labels.astype(float), list(range(len(texts))),
                             list(range(10)), "regression", 0, cfg)  # fmt: skip
    meta = meta | {"forest": kept.record()}
    (folder / FINETUNE_NAME).write_text(json.dumps(meta, indent=1))
    record_checksums(folder, kept.save(folder).name, FINETUNE_NAME)


if __name__ == "__main__":
    main()
