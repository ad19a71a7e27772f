"""Self-describing checkpoints: ``config.json`` + ``vocab.json`` + ``model.safetensors``.

No pickle anywhere. Loading checks the vocabulary against the config (size, and hash when the
config records one) and every tensor's name and shape against the model the config builds, and
fails with an error that names the mismatch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from smiexlm.errors import DataError, VocabularyMismatchError
from smiexlm.model.config import ExLMConfig
from smiexlm.paths import read_json_file
from smiexlm.tokenizer import SmilesTokenizer

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.model.model import ExLMModel

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.json"
WEIGHTS_NAME = "model.safetensors"


def _default_tokenizer(config: ExLMConfig) -> Any:
    """The shipped SMILES vocabulary when it matches the config, else a clear error."""
    try:
        tokenizer = SmilesTokenizer()
    except DataError as err:
        raise VocabularyMismatchError(
            f"save_pretrained needs the model's tokenizer: no default vocabulary ({err})"
        ) from None
    if tokenizer.vocab_size != config.vocab_size or config.vocab_hash not in (
        None,
        tokenizer.vocab_hash,
    ):
        raise VocabularyMismatchError(
            f"config has vocab_size={config.vocab_size} (hash {config.vocab_hash}) but the "
            f"default SMILES vocabulary has {tokenizer.vocab_size} tokens (hash "
            f"{tokenizer.vocab_hash}): pass the tokenizer the model was trained with"
        )
    return tokenizer


def save_model_folder(
    model: ExLMModel, directory: Path, tokenizer: Any = None, dtype: torch.dtype | None = None
) -> Path:
    """Write the three files; ``dtype`` (e.g. ``torch.float16``) casts floating weights."""
    from safetensors.torch import save_file

    config = ExLMConfig.from_dict(model.config.to_dict())
    tokenizer = tokenizer if tokenizer is not None else _default_tokenizer(config)
    if tokenizer.vocab_size != config.vocab_size:
        raise VocabularyMismatchError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model's config.vocab_size is "
            f"{config.vocab_size}"
        )
    if config.vocab_hash not in (None, tokenizer.vocab_hash):
        raise VocabularyMismatchError(
            f"tokenizer vocab_hash {tokenizer.vocab_hash} differs from the model's "
            f"config.vocab_hash {config.vocab_hash}"
        )
    config.vocab_hash = tokenizer.vocab_hash
    directory.mkdir(parents=True, exist_ok=True)
    config.save(directory / CONFIG_NAME)
    tokenizer.save(directory / VOCAB_NAME)
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        tensors[name] = value.contiguous().cpu()
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    return directory


def read_vocabulary(path: Path) -> tuple[int, str | None]:
    """(size, hash) of a vocabulary JSON holding a ``tokens`` list (and maybe a ``hash``)."""
    path, doc = read_json_file(path, "checkpoint vocabulary")
    tokens = doc.get("tokens")
    if not isinstance(tokens, list):
        raise DataError(f"checkpoint vocabulary {str(path)!r}: expected a 'tokens' list")
    return len(tokens), doc.get("hash")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; a truncated or foreign file raises DataError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except FileNotFoundError:
        raise DataError(f"{str(path)!r} does not exist") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise DataError(
            f"{str(path)!r} is not a readable safetensors file ({err}): the file is truncated "
            "or corrupted"
        ) from None


def load_model_folder(
    cls: type[ExLMModel], directory: Path, map_location: str | torch.device = "cpu"
) -> ExLMModel:
    if not directory.is_dir():
        raise DataError(f"checkpoint folder {str(directory)!r} does not exist")
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise DataError(f"checkpoint folder {str(directory)!r} has no {CONFIG_NAME}")
    config = ExLMConfig.load(config_path)
    size, vocab_hash = read_vocabulary(directory / VOCAB_NAME)
    if size != config.vocab_size:
        raise VocabularyMismatchError(
            f"{VOCAB_NAME} has {size} tokens but {CONFIG_NAME} says vocab_size="
            f"{config.vocab_size}: the vocabulary does not belong to this checkpoint"
        )
    if config.vocab_hash is not None and vocab_hash not in (None, config.vocab_hash):
        raise VocabularyMismatchError(
            f"{VOCAB_NAME} hash {vocab_hash} differs from vocab_hash {config.vocab_hash} in "
            f"{CONFIG_NAME}: the vocabulary does not belong to this checkpoint"
        )
    model = cls(config)
    expected = model.state_dict()
    weights_path = directory / WEIGHTS_NAME
    if not weights_path.is_file():
        raise DataError(f"checkpoint folder {str(directory)!r} has no {WEIGHTS_NAME}")
    loaded = load_tensors(weights_path)
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing or unexpected:
        raise DataError(
            f"{WEIGHTS_NAME} does not match {CONFIG_NAME}: missing tensors {missing[:5]}, "
            f"unexpected tensors {unexpected[:5]}"
        )
    for name, tensor in loaded.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise DataError(
                f"{WEIGHTS_NAME} tensor {name!r} has shape {tuple(tensor.shape)}: expected "
                f"{tuple(expected[name].shape)} from {CONFIG_NAME}"
            )
    model.load_state_dict(loaded)  # casts fp16 weights back to the model's dtype
    return model.to(map_location).eval()
