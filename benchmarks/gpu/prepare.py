"""What the GPU campaign carries, built on the CPU machine, and its unpacking on the GPU machine.

Carried (both folders are git-ignored; only they and the working tree travel):

- ``.whl/``: the wheels the GPU image lacks, for CPython 3.12 manylinux x86_64: RDKit and
  DeepChem (pure Python; its metadata says < 3.12 but it imports on 3.12). The RDKit wheel is
  re-zipped with LZMA (identical files, about 6 MB smaller); pip installs it as any wheel.
- ``.gpu_data/shared_data.tar.xz``: the ``SMIEXLM_DATA`` folder the test suite reads, without
  ``pretrain/moses_train.smi.gz`` and ``moses_test_scaffolds.smi.gz`` (no test reads them).
- ``.gpu_data/moses_dataset.tar.xz``: MOSES train (train split) and test (valid split) built by
  ``smiexlm preprocess`` with the shipped vocabulary, as pre-training reads it. Only ``.bin``
  shards travel: the ``.idx`` offsets are rebuilt from the EOS tokens on arrival (the manifest's
  sha256 checks them) and the ``.hash`` files only feed deduplication.
- ``.gpu_data/finetune.tar.xz``: per MoleculeNet task, the cleaned rows with their canonical
  SMILES and the scaffold split (``part``, ``rank`` columns), so fine-tuning needs no RDKit.
- ``.gpu_data/prepared.json``: sizes and sha256 of all of the above.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

MIB = 1 << 20
LIMIT_MIB = 56.0  # the working tree + carried folders must stay well under 64 MiB
PAPER_TASKS = ("bace", "bbbp", "tox21", "sider", "muv", "clintox", "toxcast")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# (distribution, version used when it is not installed here, pure-Python wheel with a stale
# Requires-Python bound)
WHEELS = (("rdkit", "2026.9.1", False), ("deepchem", "2.8.0", True))
SKIPPED_DATA = ("pretrain/moses_train.smi.gz", "pretrain/moses_test_scaffolds.smi.gz")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _mib(path: Path) -> float:
    return round(path.stat().st_size / MIB, 2)


# ------------------------------------------------------------------ CPU side: wheels
def download_wheels(whl_dir: Path, recompress: bool = True) -> list[dict]:
    """``pip download`` each of :data:`WHEELS` for CPython 3.12 manylinux x86_64 into whl_dir."""
    from importlib.metadata import PackageNotFoundError, version

    whl_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for name, fallback, ignore_python in WHEELS:
        try:
            pin = version(name)
        except PackageNotFoundError:
            pin = fallback
        for old in whl_dir.glob(f"{name}-*.whl"):
            if not old.name.startswith(f"{name}-{pin}-"):
                old.unlink()  # one version per package, or the install stops
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(whl_dir)]
        cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
        cmd += ["--ignore-requires-python"] if ignore_python else []
        subprocess.run([*cmd, f"{name}=={pin}"], check=True)
        (wheel,) = whl_dir.glob(f"{name}-{pin}-*.whl")
        if recompress and not ignore_python:
            recompress_wheel(wheel)
        done.append({"file": wheel.name, "mib": _mib(wheel), "sha256": sha256(wheel)})
    return done


def recompress_wheel(wheel: Path) -> None:
    """Rewrite a wheel with LZMA-compressed members; names, bytes and RECORD are unchanged."""
    tmp = wheel.with_suffix(".lzma-tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as out:
        if all(i.compress_type == zipfile.ZIP_LZMA for i in source.infolist()):
            tmp.unlink()
            return
        for info in source.infolist():
            member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            member.external_attr = info.external_attr
            member.compress_type = zipfile.ZIP_LZMA
            out.writestr(member, source.read(info))
    tmp.replace(wheel)


# ------------------------------------------------------------------ CPU side: data
def _tar_xz(out_file: Path, members: dict[str, Path | bytes]) -> dict:
    """A tar.xz of ``{name in archive: file path or bytes}``."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for name, item in sorted(members.items()):
            if isinstance(item, bytes):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(item), int(time.time())
                tar.addfile(info, io.BytesIO(item))
            else:
                tar.add(item, arcname=name)
    tmp.replace(out_file)
    return {"file": out_file.name, "mib": _mib(out_file), "sha256": sha256(out_file)}


def build_shared_archive(data_root: Path, out_file: Path, dry_run: bool) -> dict:
    """The test suite's ``SMIEXLM_DATA``; in a dry run only the start of MOSES test."""
    if dry_run:
        with gzip.open(data_root / "pretrain" / "moses_test.smi.gz", "rt") as handle:
            head = "".join(next(handle) for _ in range(2000))
        return _tar_xz(out_file, {"pretrain/moses_test.smi.gz": gzip.compress(head.encode())})
    members = {
        str(p.relative_to(data_root)): p
        for p in sorted(data_root.rglob("*"))
        if p.is_file() and str(p.relative_to(data_root)) not in SKIPPED_DATA
    }
    return _tar_xz(out_file, members)


def build_moses_dataset(data_root: Path, out_file: Path, workers: int, dry_run: bool) -> dict:
    """MOSES train + test as ``smiexlm preprocess`` writes them (test = the valid split)."""
    from smiexlm.data.pipeline import PreprocessConfig, preprocess

    with tempfile.TemporaryDirectory() as tmp:
        train = data_root / "pretrain" / "moses_train.smi.gz"
        valid = data_root / "pretrain" / "moses_test.smi.gz"
        if dry_run:  # a few hundred molecules: 300 to train on, 60 to validate on
            with gzip.open(valid, "rt") as handle:
                lines = handle.read().splitlines()
            train, valid = Path(tmp) / "train.smi", Path(tmp) / "valid.smi"
            train.write_text("\n".join(lines[:300]) + "\n")
            valid.write_text("\n".join(lines[300:360]) + "\n")
        out = Path(tmp) / "moses"
        config = PreprocessConfig(valid_fraction=0.0)
        result = preprocess(
            [train], out, config, valid_inputs=[valid], workers=workers, progress=not dry_run
        )
        keep = [p for p in out.iterdir() if p.suffix not in (".idx", ".hash")]
        keep = [p for p in keep if p.name != "progress.json"]
        info = _tar_xz(out_file, {p.name: p for p in keep})
        manifest = json.loads((out / "manifest.json").read_text())
    info.update(
        molecules={k: v["molecules"] for k, v in manifest["splits"].items()},
        tokens={k: v["tokens"] for k, v in manifest["splits"].items()},
        summary=result.summary(),
    )
    return info


def build_finetune_cache(out_file: Path, tasks: tuple[str, ...], rows: int | None) -> dict:
    """Per task: cleaned rows, canonical SMILES (``input``) and the scaffold split."""
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.splits import make_split

    members: dict[str, Path | bytes] = {}
    sizes = {}
    for task in tasks:
        loaded = load_task(task, allow_download=False)
        if rows is not None:
            loaded = loaded.subset(range(min(rows, len(loaded))))
        smiles = loaded.smiles
        split = make_split(smiles, "scaffold", 0)
        frame = loaded.table()
        frame.insert(1, "input", Backbone().model_texts(smiles, canonicalize=True))
        frame["part"], frame["rank"] = "", -1
        for part in ("train", "valid", "test"):
            index = list(getattr(split, part))
            frame.loc[index, "part"] = part
            frame.loc[index, "rank"] = range(len(index))
        attrs = dict(  # what finetune_job.py needs to make the task again
            name=loaded.name,
            task_type=loaded.task_type,
            label_cols=loaded.label_cols,
            source=f"moleculenet/{Path(loaded.source or task).name}",
            sha256=loaded.sha256,
            n_raw=loaded.n_raw,
            n_invalid=loaded.n_invalid,
            invalid=loaded.invalid,
            split=split.label,
            sizes=list(split.sizes),
            rows=len(frame),
        )
        members[f"{task}.csv"] = frame.to_csv(index=False).encode()
        members[f"{task}.json"] = json.dumps(attrs, indent=1, default=str).encode()
        sizes[task] = list(split.sizes)
    info = _tar_xz(out_file, members)
    info["splits"] = sizes
    return info


def travelling_mib(root: Path, carried: list[Path]) -> dict[str, float]:
    """MiB of the working tree that travels (tracked and untracked-not-ignored files) and of
    each carried folder."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    tree = sum(
        (root / n.decode()).stat().st_size for n in listed if n and (root / n.decode()).is_file()
    )
    sizes = {"working tree": round(tree / MIB, 2)}
    for folder in carried:
        if folder.is_dir():
            total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            sizes[folder.name + "/"] = round(total / MIB, 2)
    sizes["total"] = round(sum(sizes.values()), 2)
    return sizes


def prepare(
    root: Path,
    data_root: Path,
    whl_dir: Path,
    out_dir: Path,
    dry_run: bool = False,
    wheels: bool = True,
    workers: int = 2,
    limit_mib: float = LIMIT_MIB,
    tasks: tuple[str, ...] = PAPER_TASKS,
) -> dict:
    """Build everything the GPU slot carries; returns (and writes) ``prepared.json``."""
    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {"format": "smiexlm-gpu-prepared/1", "dry_run": dry_run}
    doc["wheels"] = download_wheels(whl_dir) if wheels else []
    doc["shared_data"] = build_shared_archive(data_root, out_dir / "shared_data.tar.xz", dry_run)
    doc["moses"] = build_moses_dataset(
        data_root, out_dir / "moses_dataset.tar.xz", workers, dry_run
    )
    rows, tasks = (200, ("bbbp",)) if dry_run else (None, tasks)
    doc["finetune"] = build_finetune_cache(out_dir / "finetune.tar.xz", tasks, rows)
    doc["sizes_mib"] = travelling_mib(root, [whl_dir, out_dir]) if not dry_run else {}
    doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
    (out_dir / "prepared.json").write_text(json.dumps(doc, indent=1))
    total = doc["sizes_mib"].get("total", 0.0)
    if total > limit_mib:
        raise SystemExit(
            f"what travels is {total} MiB ({doc['sizes_mib']}): over the {limit_mib} MiB "
            "limit; carry less (e.g. prepare --no-wheels) or raise --limit-mib below 64"
        )
    return doc


# ------------------------------------------------------------------ GPU side
def install_wheels(whl_dir: Path, site: Path) -> dict:
    """pip-install the carried wheels into ``site`` (no index, no dependencies); should pip
    fail, unzip them there."""
    wheels = sorted(whl_dir.glob("*.whl")) if whl_dir.is_dir() else []
    if not wheels:
        return {"installed": [], "note": f"no wheels in {whl_dir.name}/"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return {"installed": [w.name for w in wheels], "by": "pip"}
    for wheel in wheels:  # a wheel is a zip of its install tree: unzip it as pip would
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    return {"installed": [w.name for w in wheels], "by": "unzip", "pip_error": proc.stderr[-1500:]}


def extract(archive: Path, dest: Path) -> Path:
    """Unpack a tar.xz made by :func:`_tar_xz` into dest (members are plain relative files)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            if member.name.startswith(("/", "..")) or not (member.isfile() or member.isdir()):
                raise RuntimeError(f"{archive.name}: unexpected member {member.name!r}")
        tar.extractall(dest, filter="data")
    return dest


def rebuild_offsets(dataset: Path) -> int:
    """Write each shard's ``.idx`` from the EOS positions of its ``.bin``; returns molecules."""
    import numpy as np

    from smiexlm.tokenizer.special import EOS_ID

    manifest = json.loads((dataset / "manifest.json").read_text())
    total = 0
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            ids = np.fromfile(dataset / f"{shard['name']}.bin", dtype="<u2")
            ends = np.flatnonzero(ids == EOS_ID) + 1
            offsets = np.concatenate([[0], ends]).astype("<i8")
            offsets.tofile(dataset / f"{shard['name']}.idx")
            total += len(ends)
    return total


def unpack_inputs(gpu_data: Path, run_dir: Path) -> dict:
    """``data/`` (SMIEXLM_DATA), ``moses/`` (the pre-training dataset) and ``finetune/``."""
    from smiexlm.data.shards import TokenDataset

    info = {}
    for name, folder in (("shared_data", "data"), ("finetune", "finetune")):
        archive = gpu_data / f"{name}.tar.xz"
        if not archive.is_file():
            raise FileNotFoundError(f"{archive} is missing: run `campaign.py prepare` first")
        extract(archive, run_dir / folder)
        info[f"{folder}_files"] = sum(1 for p in (run_dir / folder).rglob("*") if p.is_file())
    moses = extract(gpu_data / "moses_dataset.tar.xz", run_dir / "moses")
    info["moses_molecules"] = rebuild_offsets(moses)
    for split in ("train", "valid"):  # opening checks the rebuilt offsets against the sha256
        info[f"moses_{split}"] = len(TokenDataset(moses, split))
    shutil.rmtree(run_dir / "moses" / "__pycache__", ignore_errors=True)
    return info
