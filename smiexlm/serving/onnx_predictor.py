"""A fine-tuned folder served from its exported ``predictor.onnx`` (``smiexlm predict
--backend onnx``), on the checked sessions of :mod:`smiexlm.embedding.onnx_runtime`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from smiexlm.embedding.onnx_runtime import check_rows, open_session, padded, read_graph
from smiexlm.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.modelio.folder import FinetunedFolder


class OnnxPredictor:
    """A fine-tuned folder served from its ``predictor.onnx``: its reader (``finetune.json``,
    config, tokenizer and normalisation, each checked) and the checked graph; :meth:`logits`
    batches like the torch engine's ``predict``."""

    def __init__(self, folder: FinetunedFolder, threads: int | None = None):
        payload, record = read_graph(folder, "predictor")
        self.folder = folder
        self.meta = folder.meta
        self.config = folder.config
        self.tokenizer = folder.tokenizer
        self.inputs = folder.inputs()
        self.n_features = int(record.get("n_features", 0))
        self.session = open_session(payload, threads)

    def logits(
        self, rows: list[list[int]], features: np.ndarray | None, batch_size: int = 256
    ) -> np.ndarray:
        """(N, n_outputs) float32 logits in input order; ``features`` (N, F) for a hybrid
        head. Length-sorted batches of at most ``batch_size`` rows and the engine's padded
        token budget, as :func:`smiexlm.finetuning.predict` cuts them."""
        from smiexlm.finetuning.batches import sorted_batches
        from smiexlm.finetuning.inference import EVAL_MAX_TOKENS

        if (features is None) != (self.n_features == 0) or (
            features is not None and features.shape != (len(rows), self.n_features)
        ):
            got = None if features is None else features.shape
            raise ConfigError("features", got, f"({len(rows)}, {self.n_features}) or None as trained")  # fmt: skip
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        out = np.zeros((len(rows), int(self.meta["n_outputs"])), dtype=np.float32)
        for index in sorted_batches(lengths, batch_size, EVAL_MAX_TOKENS):
            ids, mask = padded([rows[i] for i in index], self.config.pad_id)
            check_rows(ids, mask, self.config)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if features is not None:
                feeds["features"] = np.ascontiguousarray(features[index], dtype=np.float32)
            out[index] = self.session.run(["logits"], feeds)[0]
        return out
