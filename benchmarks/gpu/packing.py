"""Pack a campaign's results into a few size-limited files, and unpack them.

What comes back from the GPU machine is at most ``MAX_FILES`` files of at most ``MAX_FILE_MIB``
MiB each, in one flat folder:

- ``progress.json``: the campaign's progress file, every phase's figures in it (JSON);
- ``report.md``: the same figures as Markdown tables;
- ``logs.tar.xz``: every log, JUnit XML, metrics.jsonl, config and result file of the run
  (split into ``logs.tar.xz.00``, ``.01``… when larger than one file may be);
- ``weights.safetensors.index.json`` + ``weights-0000k-of-0000n.safetensors``: the pre-trained
  models' weights in fp16, tensors named ``<run>/<tensor>``, the index holding each model's
  ``config.json`` and ``vocab.json`` (see :mod:`smiexlm.modelio.shards`).

When everything does not fit, the weights of the last model are dropped first (the pack says
so in ``progress.json``); if it still does not fit, :class:`PackError` lists the files.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from pathlib import Path

MIB = 1 << 20
MAX_FILES, MAX_FILE_MIB, MAX_TOTAL_MIB = 8, 16, 64
WEIGHTS_STEM = "weights"
NAME = re.compile(r"[A-Za-z0-9._-]+")
PACKED = re.compile(r"progress\.json|report\.md|logs\.tar\.xz(\.\d\d)?|weights[-.].*safetensors.*")
LOG_SUFFIXES = {".log", ".xml", ".json", ".jsonl", ".md", ".toml", ".txt", ".csv", ".png"}
SKIPPED_DIRS = {
    "src",
    "site",
    "data",
    "moses",
    "finetune",
    "peer_build",
    "bin",
    "cache",
    "__pycache__",
}


class PackError(RuntimeError):
    """The results do not fit the limits on what comes back."""


def log_files(run_dir: Path) -> list[Path]:
    """The run's text artefacts, without inputs, code, weights or optimizer states."""
    out = []
    for path in sorted(run_dir.rglob("*")):
        parts = path.relative_to(run_dir).parts
        if path.is_file() and path.suffix in LOG_SUFFIXES and not SKIPPED_DIRS & set(parts):
            if "checkpoints" in parts and path.suffix not in (".json", ".toml"):
                continue
            out.append(path)
    return out


def write_logs(run_dir: Path, out_dir: Path, max_bytes: int) -> list[Path]:
    """``logs.tar.xz`` of :func:`log_files`, in parts of at most ``max_bytes``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for path in log_files(run_dir):
            tar.add(path, arcname=str(path.relative_to(run_dir)))
    data = buffer.getvalue()
    if len(data) <= max_bytes:
        (out_dir / "logs.tar.xz").write_bytes(data)
        return [out_dir / "logs.tar.xz"]
    parts = []
    for i, start in enumerate(range(0, len(data), max_bytes)):
        parts.append(out_dir / f"logs.tar.xz.{i:02d}")
        parts[-1].write_bytes(data[start : start + max_bytes])
    return parts


def model_sources(run_dir: Path) -> dict[str, Path]:
    """Run name -> the checkpoint folder to ship (``best`` when validated, else ``last``)."""
    found = {}
    for run in sorted((run_dir / "phase3").glob("*")) if (run_dir / "phase3").is_dir() else []:
        for name in ("best", "last"):
            folder = run / "checkpoints" / name
            if (folder / "model.safetensors").is_file():
                found[run.name] = folder
                break
    return found


def write_weights(sources: dict[str, Path], out_dir: Path, max_shard_mib: float) -> list[Path]:
    from smiexlm.modelio.integrity import load_tensors
    from smiexlm.modelio.shards import save_sharded

    tensors, models = {}, {}
    for run, folder in sources.items():
        for key, value in load_tensors(folder / "model.safetensors").items():
            tensors[f"{run}/{key}"] = value.half() if value.is_floating_point() else value
        state = json.loads((folder / "trainer_state.json").read_text()).get("state", {})
        models[run] = {
            "config": json.loads((folder / "config.json").read_text()),
            "vocab": json.loads((folder / "vocab.json").read_text()),
            "checkpoint": folder.name,
            "step": state.get("step"),
        }
    if not tensors:
        return []
    meta = {"models": models, "dtype": "float16"}
    index = save_sharded(tensors, out_dir, max_shard_mib, stem=WEIGHTS_STEM, metadata=meta)
    return [index, *sorted(out_dir.glob(f"{WEIGHTS_STEM}-*-of-*.safetensors"))]


def check_limits(out_dir: Path) -> list[str]:
    """Every way ``out_dir`` breaks the limits on what comes back (empty when it fits)."""
    files = [p for p in out_dir.rglob("*") if p.is_file()]
    problems = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than {MAX_FILES}")
    for path in files:
        if path.stat().st_size > MAX_FILE_MIB * MIB:
            problems.append(f"{path.name} has {path.stat().st_size / MIB:.1f} MiB")
        if not NAME.fullmatch(path.name) or len(path.relative_to(out_dir).parts) > 3:
            problems.append(f"{path.relative_to(out_dir)} has a name or depth that cannot travel")
    total = sum(p.stat().st_size for p in files)
    if total > MAX_TOTAL_MIB * MIB:
        problems.append(f"{total / MIB:.1f} MiB in all, more than {MAX_TOTAL_MIB}")
    return problems


def pack(run_dir: Path, out_dir: Path, render_report, weights: bool = True) -> dict:
    """Write the packed results of ``run_dir`` into ``out_dir`` (replacing an earlier pack's
    files there); returns a record of what was written. ``render_report(run_dir) -> str`` makes ``report.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = model_sources(run_dir) if weights else {}
    dropped: list[str] = []
    while True:
        for old in out_dir.iterdir():  # only what an earlier pack wrote
            if old.is_file() and PACKED.fullmatch(old.name):
                old.unlink()
        progress = run_dir / "progress.json"
        if progress.is_file():
            shutil.copy2(progress, out_dir / "progress.json")
        (out_dir / "report.md").write_text(render_report(run_dir))
        write_logs(run_dir, out_dir, MAX_FILE_MIB * MIB)
        write_weights(sources, out_dir, MAX_FILE_MIB)
        problems = check_limits(out_dir)
        if not problems:
            break
        if not sources:
            raise PackError("the results do not fit: " + "; ".join(problems))
        dropped.append(list(sources)[-1])
        sources.pop(dropped[-1])
    files = {p.name: round(p.stat().st_size / MIB, 3) for p in sorted(out_dir.iterdir())}
    return {"files_mib": files, "models": sorted(sources), "weights_dropped": dropped}


def unpack(packed: Path, dest: Path) -> dict:
    """Rebuild a packed folder: ``dest/logs/`` (the run's text files), ``dest/models/<run>/``
    (model folders ``ExLMModel.from_pretrained`` loads), progress.json and report.md."""
    from smiexlm.modelio.shards import index_name, load_sharded, read_index, save_sharded

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("progress.json", "report.md"):
        if (packed / name).is_file():
            shutil.copy2(packed / name, dest / name)
    parts = sorted(packed.glob("logs.tar.xz.*")) or [packed / "logs.tar.xz"]
    if parts[0].is_file():
        data = b"".join(p.read_bytes() for p in parts)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
            tar.extractall(dest / "logs", filter="data")
    models = {}
    index = packed / index_name(WEIGHTS_STEM)
    if index.is_file():
        meta, _ = read_index(index)
        tensors = load_sharded(index)
        for run, info in meta["models"].items():
            folder = dest / "models" / run
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps(info["config"], indent=2))
            (folder / "vocab.json").write_text(json.dumps(info["vocab"]))
            mine = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(run + "/")}
            source = {"source": f"{run} {info['checkpoint']}"}
            save_sharded(mine, folder, MAX_FILE_MIB, metadata=source)
            models[run] = folder
    return {"models": {k: str(v) for k, v in models.items()}, "logs": (dest / "logs").is_dir()}
