"""What a fine-tuned folder keeps of its own data to say how far a prediction can be
trusted: ``reference.safetensors``.

- ``train_ecfp4`` (N, 256) uint8 and ``train_embedding`` (N, d) float32: the packed ECFP4
  fingerprints and the unit-length pooled embeddings of the training molecules, for the
  applicability domain (:mod:`smiexlm.trust.domain`); no SMILES are kept, but the
  fingerprints and embeddings do describe the training molecules: a folder shared outside
  the team shares them too;
- ``valid_labels``, ``valid_logits``, ``valid_scores`` (M, T) float32 (NaN: missing label):
  the validation molecules' labels and what the saved model gives them (canonical SMILES,
  served precision), for temperature scaling and conformal calibration;
- ``valid_tanimoto``, ``valid_cosine`` (M,) float64: each validation molecule's nearest
  training similarity, the domain's bounds.

The file's sha256 is in the folder's ``checksums.json``. Folders written before it existed
load and predict without the columns that need it (``predict`` says so, once per folder).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from smiexlm.errors import DataError
from smiexlm.modelio.layout import REFERENCE_NAME
from smiexlm.trust.domain import (
    DEFAULT_QUANTILE,
    DomainBounds,
    cosine_neighbours,
    tanimoto_neighbours,
    unit_rows,
)


@dataclass
class Reference:
    train_ecfp4: np.ndarray
    train_embedding: np.ndarray
    valid_labels: np.ndarray
    valid_logits: np.ndarray
    valid_scores: np.ndarray
    valid_tanimoto: np.ndarray
    valid_cosine: np.ndarray

    @classmethod
    def build(
        cls, train_smiles: list[str], train_pooled: np.ndarray, valid_smiles: list[str],
        valid_pooled: np.ndarray, valid_labels: np.ndarray, valid_logits: np.ndarray,
        valid_scores: np.ndarray,
    ) -> Reference:  # fmt: skip
        """From the model-side SMILES and pooled features of the train and validation rows."""
        from smiexlm.chemistry.fingerprints import ecfp4_packed

        train_bits = ecfp4_packed(train_smiles)
        train_embedding = unit_rows(train_pooled)
        tanimoto, _ = tanimoto_neighbours(ecfp4_packed(valid_smiles), train_bits)
        cosine, _ = cosine_neighbours(valid_pooled, train_embedding)
        return cls(
            train_bits.view(np.uint8).reshape(len(train_bits), -1), train_embedding,
            *(np.asarray(a, dtype=np.float32) for a in (valid_labels, valid_logits, valid_scores)),
            tanimoto, cosine,
        )  # fmt: skip

    def nearness(self, smiles: list[str], pooled: np.ndarray) -> dict[str, np.ndarray]:
        """Nearest and mean-of-k training similarities of other molecules (their model-side
        SMILES and pooled embeddings): ``tanimoto``, ``mean_tanimoto``, ``cosine``,
        ``mean_cosine``."""
        from smiexlm.chemistry.fingerprints import ecfp4_packed

        tanimoto = tanimoto_neighbours(ecfp4_packed(smiles), self.train_ecfp4)
        cosine = cosine_neighbours(pooled, self.train_embedding)
        return {"tanimoto": tanimoto[0], "mean_tanimoto": tanimoto[1],
                "cosine": cosine[0], "mean_cosine": cosine[1]}  # fmt: skip

    def bounds(self, quantile: float = DEFAULT_QUANTILE) -> DomainBounds:
        """The domain's bounds from the validation molecules' nearness (:class:`DomainBounds`)."""
        return DomainBounds.of(self.valid_tanimoto, self.valid_cosine, quantile)

    def save(self, folder: Path) -> Path:
        from safetensors.numpy import save_file

        path = Path(folder) / REFERENCE_NAME
        arrays = {f.name: np.ascontiguousarray(getattr(self, f.name)) for f in fields(self)}
        save_file(arrays, str(path), metadata={"format": "smiexlm-reference/1"})
        return path

    @classmethod
    def load(cls, folder: Path | str) -> Reference | None:
        """The folder's reference, checked against its sha256 and its shapes; None when the
        folder has none (written before it existed)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        from smiexlm.modelio.integrity import verify_checksum

        path = Path(folder) / REFERENCE_NAME
        if not path.is_file():
            return None
        verify_checksum(path, required=True)
        try:
            arrays = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise DataError(f"{str(path)!r}: not a readable safetensors file ({exc})") from None
        missing = [f.name for f in fields(cls) if f.name not in arrays]
        if missing:
            raise DataError(f"{str(path)!r}: no {missing}: expected every array of a reference")
        ref = cls(**{f.name: arrays[f.name] for f in fields(cls)})
        ref._check(path)
        return ref

    def _check(self, path: Path) -> None:
        n, m = len(self.train_ecfp4), len(self.valid_labels)
        shapes = {
            "train_ecfp4": (n, 256), "train_embedding": (n, self.train_embedding.shape[-1]),
            "valid_logits": self.valid_labels.shape, "valid_scores": self.valid_labels.shape,
            "valid_tanimoto": (m,), "valid_cosine": (m,),
        }  # fmt: skip
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise DataError(
                    f"{str(path)!r}: {name} has shape {getattr(self, name).shape}: expected "
                    f"{shape} (train {n}, validation {m} molecules)"
                )


def require_reference(folder: Path | str, reference: Reference | None, option: str) -> None:
    """DataError unless the folder kept its reference, which ``option`` needs."""
    if reference is None:
        raise DataError(
            f"--checkpoint {str(folder)!r}: no reference.safetensors (fine-tuned before "
            f"it was kept), which {option} needs: expected a folder fine-tuned by this version"
        )
