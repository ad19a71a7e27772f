"""Self-describing model folders: ``config.json`` + ``vocab.json`` + ``model.safetensors``.

No pickle anywhere. ``checksums.json`` records the sha256 of ``model.safetensors``
(:mod:`smiexlm.modelio.integrity`). Loading checks, in this order and before the model is
allocated: the vocabulary against the config (size, and the hash computed from its tokens when
the config records one); the sizes the config implies (``d_model``, ``n_layers``,
``max_positions``...) and every tensor's name, dtype and shape against the weight file's header;
the file against its recorded sha256.
The loaded tensors must be finite. Each failure is an error that names the file and the
mismatch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from smiexlm.atomic import write_text_atomic
from smiexlm.chemistry.descriptor_stats import STATS_NAME, load_model_descriptor_stats
from smiexlm.errors import DataError, VocabularyMismatchError
from smiexlm.model.config import ExLMConfig
from smiexlm.modelio.integrity import (
    Header,
    check_finite,
    load_tensors,
    read_header,
    record_checksums,
    verify_checksum,
)
from smiexlm.modelio.layout import CHECKSUMS_NAME, CONFIG_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from smiexlm.modelio.shards import load_sharded, read_index, save_sharded
from smiexlm.paths import VOCAB_NAME, check_not_a_file, read_json_file
from smiexlm.tokenizer import SmilesTokenizer, vocabulary_file_hash

# the network's class (``ExLMModel``), passed in by its ``from_pretrained``: this package sits
# above the network and never imports it back
Model = TypeVar("Model", bound=nn.Module)


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
    model: nn.Module, folder: Path, tokenizer: Any = None, dtype: torch.dtype | None = None
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
    folder.mkdir(parents=True, exist_ok=True)
    config.save(folder / CONFIG_NAME)
    tokenizer.save(folder / VOCAB_NAME)
    if getattr(model, "descriptor_stats", None) is not None:  # how to denormalise its head
        model.descriptor_stats.save(folder / STATS_NAME)
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        tensors[name] = value.contiguous().cpu()
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    record_checksums(folder, WEIGHTS_NAME)
    return folder


def load_model_folder(
    cls: type[Model], folder: Path, map_location: str | torch.device = "cpu"
) -> Model:
    """The model of a folder, every file checked before its weights are read."""
    if not check_not_a_file(folder).is_dir():
        raise DataError(f"model folder {str(folder)!r} does not exist")
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise DataError(f"model folder {str(folder)!r} has no {CONFIG_NAME}")
    config = ExLMConfig.load(config_path)
    check_folder_vocabulary(folder, config)
    descriptor_stats = load_model_descriptor_stats(folder, config.n_descriptors)
    weights_path = folder / WEIGHTS_NAME
    if not weights_path.is_file() and (folder / WEIGHTS_INDEX_NAME).is_file():
        return load_sharded_model(cls, folder, map_location)  # weights in <= N MiB shards
    if not weights_path.is_file():
        raise DataError(f"model folder {str(folder)!r} has no {WEIGHTS_NAME}")
    header = read_header(weights_path)
    check_config_sizes(config, header, config_path, weights_path)
    # the sizes agree with the file, so the model is no larger than its weights (built on the
    # CPU: under torch.device("meta") its init would import torch._dynamo, seconds a process)
    model = cls(config)
    check_tensors(model.state_dict(), header, weights_path, CONFIG_NAME)
    verify_checksum(weights_path)
    loaded = load_tensors(weights_path)
    check_finite(loaded, weights_path)
    model.load_state_dict(loaded)  # casts fp16 weights back to the model's dtype
    model.descriptor_stats = descriptor_stats
    return model.to(map_location).eval()


def save_pretrained_sharded(
    model: nn.Module,
    directory: Path | str,
    tokenizer: Any = None,
    dtype: torch.dtype | None = None,
    max_shard_mib: float = 16.0,
) -> Path:
    """A model folder (``config.json``, ``vocab.json``) with its weights sharded
    (:mod:`smiexlm.modelio.shards`); the folder appears complete or not at all. ``dtype`` (e.g.
    ``torch.float16``) casts floating weights."""
    from smiexlm.atomic import atomic_dir

    with atomic_dir(directory) as tmp:
        save_model_folder(model, tmp, tokenizer=tokenizer, dtype=dtype)
        single = tmp / WEIGHTS_NAME
        index = save_sharded(load_tensors(single), tmp, max_shard_mib)
        single.unlink()
        _replace_checksum_record(tmp, WEIGHTS_NAME, read_index(index)[0]["sha256"])
    return Path(directory)


def _replace_checksum_record(folder: Path, single: str, shards: dict[str, str]) -> None:
    """In a folder's ``checksums.json`` (when it has one), the shards replace the single file."""
    path = folder / CHECKSUMS_NAME
    if not path.is_file():
        return
    _, doc = read_json_file(path, "checksums file")
    digests = {k: v for k, v in doc.get("sha256", {}).items() if k != single} | shards
    write_text_atomic(path, json.dumps({**doc, "sha256": dict(sorted(digests.items()))}, indent=1))


def load_sharded_model(
    cls: type[Model], folder: Path, map_location: str | torch.device = "cpu"
) -> Model:
    """The model of a folder whose weights are sharded.

    The shards are checked against the index (presence, sha256, tensor names), joined into a
    single ``model.safetensors`` in a temporary folder beside copies of the folder's other
    files, and that folder is loaded by :func:`load_model_folder`, so every check of a
    single-file folder (vocabulary, config sizes, shapes, finite values) applies unchanged."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    index = Path(folder) / WEIGHTS_INDEX_NAME
    tensors = load_sharded(index)
    skip = set(read_index(index)[1].values()) | {WEIGHTS_INDEX_NAME, CHECKSUMS_NAME}
    with tempfile.TemporaryDirectory(prefix="smiexlm-shards-") as tmp:
        joined = Path(tmp)
        for item in Path(folder).iterdir():
            if item.is_file() and item.name not in skip:
                shutil.copy2(item, joined / item.name)
        save_file(tensors, str(joined / WEIGHTS_NAME), metadata={"format": "pt"})
        return load_model_folder(cls, joined, map_location=map_location)


def load_module_weights(module: nn.Module, path: Path, source: str) -> None:
    """Load a safetensors file into ``module`` with the checks of :func:`load_model_folder`;
    ``source`` names what decided the module's shapes (for errors)."""
    if not path.is_file():
        raise DataError(f"folder {str(path.parent)!r} has no {path.name}")
    check_tensors(module.state_dict(), read_header(path), path, source)
    verify_checksum(path)
    loaded = load_tensors(path)
    check_finite(loaded, path)
    module.load_state_dict(loaded)


def check_folder_vocabulary(folder: Path, config: ExLMConfig) -> None:
    """The folder's vocabulary is the config's: its size, and the hash of its tokens (computed,
    whatever the file records) against the config's ``vocab_hash`` when it has one."""
    path, size, found = vocabulary_file_hash(folder / VOCAB_NAME)
    if size != config.vocab_size:
        raise VocabularyMismatchError(
            f"{str(path)!r} has {size} tokens but {CONFIG_NAME} says vocab_size="
            f"{config.vocab_size}: the vocabulary does not belong to this model folder"
        )
    if config.vocab_hash is not None and found != config.vocab_hash:
        raise VocabularyMismatchError(
            f"{str(path)!r}: its tokens hash to {found}, but {CONFIG_NAME} expects vocab_hash "
            f"{config.vocab_hash}: the vocabulary was edited or does not belong to this model folder"
        )


_LAYER = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.")
# with the layer names, these fix the model's size
_SIZE_TENSORS = ("embed.weight", "encoder.layers.0.ffn.fc1.weight")


def _sizes_in_header(config: ExLMConfig, header: Header) -> list[tuple[str, float, str]]:
    """(config field, value the weights imply, the tensors that say so)."""
    shapes = {name: shape for name, (_, shape) in header.items()}

    def matrix(name: str) -> tuple[int, ...]:
        return shapes[name] if len(shapes.get(name, ())) == 2 else ()

    def said(name: str) -> str:
        return f"{name} of shape {shapes[name]}"

    found: list[tuple[str, float, str]] = []
    if embed := matrix("embed.weight"):
        found += [("vocab_size", embed[0], said("embed.weight"))]
        found += [("d_model", embed[1], said("embed.weight"))]
    if fc1 := matrix("encoder.layers.0.ffn.fc1.weight"):
        found.append(("d_ff", fc1[0], said("encoder.layers.0.ffn.fc1.weight")))
    layers: dict[str, int] = {}
    for name in shapes:
        if match := _LAYER.match(name):
            stack, index = match.group(1), int(match.group(2))
            layers[stack] = max(layers.get(stack, 0), index + 1)
    for stack, field in (("encoder", "n_layers"), ("decoder", "maelm_decoder_layers")):
        if stack in layers and (stack == "encoder" or config.objective == "maelm"):
            found.append((field, layers[stack], f"{stack}.layers.0 to {layers[stack] - 1}"))
    if table := matrix("transitions.position.weight"):  # k * max_positions rows
        implied = table[0] // config.k if table[0] % config.k == 0 else table[0] / config.k
        evidence = f"{said('transitions.position.weight')}, k = {config.k}"
        found.append(("max_positions", implied, evidence))
    if gate := matrix("transitions.gate.weight"):
        found.append(("n_transition_heads", gate[0], said("transitions.gate.weight")))
    return found


def check_config_sizes(
    config: ExLMConfig, header: Header, config_path: Path, weights_path: Path
) -> None:
    """DataError naming the first config field whose value the weights contradict, or the
    tensors that fix the model's size when the weights lack them (so that a model built from
    ``config`` is never larger than its weights)."""
    absent = [name for name in _SIZE_TENSORS if name not in header]
    if absent:
        raise DataError(
            f"{str(weights_path)!r} does not match {config_path.name}: missing tensors {absent}"
        )
    for field, implied, evidence in _sizes_in_header(config, header):
        value = getattr(config, field)
        if value != implied:
            raise DataError(
                f"{str(config_path)!r} field {field!r} = {value!r}, but {weights_path.name} "
                f"holds {evidence}: {field} = {implied!r}; the config does not belong to "
                "these weights"
            )


def check_tensors(
    expected: dict[str, torch.Tensor], header: Header, path: Path, source: str
) -> None:
    """Every tensor of ``expected`` (a state dict) in ``header``, none more, with its shape,
    and a floating dtype for floating parameters."""
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    if missing or unexpected:
        raise DataError(
            f"{str(path)!r} does not match {source}: missing tensors {missing[:5]}, unexpected "
            f"tensors {unexpected[:5]}"
        )
    for name, (dtype, shape) in header.items():
        want = tuple(expected[name].shape)
        if shape != want:
            raise DataError(
                f"{path.name} tensor {name!r} has shape {shape}: expected {want} from {source}"
            )
        if expected[name].is_floating_point() and dtype not in ("F16", "BF16", "F32", "F64"):
            raise DataError(
                f"{path.name} tensor {name!r} has dtype {dtype}: expected a floating type "
                "(F16, BF16, F32 or F64)"
            )
