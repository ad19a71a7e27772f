"""Resuming and cleaning up a ``preprocess`` output folder.

``check_resume`` refuses to continue with another vocabulary, config or inputs;
``drop_uncommitted`` removes what an interrupted run wrote after its last ``progress.json``
commit; ``remove_run`` deletes what a run that committed no shard left behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, get_args

from smiexlm.atomic import is_temporary_name, remove_path
from smiexlm.chemistry.descriptor_stats import STATS_NAME
from smiexlm.data.shards import SHARD_SUFFIXES, Split
from smiexlm.errors import ConfigError, DataError, VocabularyMismatchError
from smiexlm.paths import VOCAB_NAME

SPLITS: tuple[str, ...] = get_args(Split)
# The pipeline's own files besides the shards (a run that committed nothing removes them).
WRITTEN = (VOCAB_NAME, "rejects.csv", "progress.json", "manifest.json", STATS_NAME)


def check_resume(saved, vocab_hash, cfg_doc, source_docs, out) -> None:
    if saved.get("vocab_hash") != vocab_hash:
        raise VocabularyMismatchError(
            f"dataset {str(out)!r} was started with vocabulary hash {saved.get('vocab_hash')!r} "
            f"but this run uses {vocab_hash!r}: resume with the same vocabulary (copy "
            f"{str(out / VOCAB_NAME)!r} out of the folder and pass the copy with --vocab) or "
            "start a new folder"
        )
    saved_cfg = dict(saved["config"])
    if "max_tokens" in saved_cfg:  # a dataset started before max_length had its name
        saved_cfg["max_length"] = saved_cfg.pop("max_tokens")
    saved_cfg.setdefault("strip_stereo", False)  # a dataset started before the option existed
    for key, value in cfg_doc.items():
        if saved_cfg.get(key) != value:
            raise ConfigError(
                key, value, f"{saved_cfg.get(key)!r}, the value the interrupted run used"
            )
    # Inputs match by role and content, in order: a file moved or named another way since
    # (a relative path against an absolute one) resumes; another file does not.
    old = [(s["role"], s["sha256"]) for s in saved["sources"]]
    new = [(s["role"], s["sha256"]) for s in source_docs]
    if old != new:
        were = [(s["path"], s["role"], s["sha256"][:16]) for s in saved["sources"]]
        are = [(s["path"], s["role"], s["sha256"][:16]) for s in source_docs]
        raise DataError(
            f"inputs {are!r} differ from those of the interrupted run {were!r} (roles or "
            "sha256, in order): resume with the same files or start a new folder"
        )


def drop_uncommitted(out: Path, state: Any) -> None:
    """Remove what an interrupted run wrote after its last recorded commit."""
    committed = {s["name"] for split in SPLITS for s in state.shards[split]}
    for path in out.iterdir():
        stem, suffix = os.path.splitext(path.name)
        if (
            is_temporary_name(path.name)
            or path.name.endswith(".tmp")
            or (suffix in SHARD_SUFFIXES and stem.split("-")[0] in SPLITS and stem not in committed)
        ):
            remove_path(path)
    with open(out / "rejects.csv", "r+b") as handle:
        handle.truncate(state.rejects_bytes)


def remove_run(out: Path, folder_existed: bool) -> None:
    """Delete what a run that committed no shard wrote (only the pipeline's own files)."""
    if not out.is_dir():
        return
    for path in out.iterdir():
        stem, suffix = os.path.splitext(path.name)
        ours = path.name in WRITTEN or (suffix in SHARD_SUFFIXES and stem.split("-")[0] in SPLITS)
        if is_temporary_name(path.name) or (path.is_file() and ours):
            remove_path(path)
    if not folder_existed and not any(out.iterdir()):
        out.rmdir()
