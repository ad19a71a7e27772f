"""The package's shape: tokenization in one folder, one home per helper, layers that hold."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "smiexlm"
SPECIAL_NAMES = {
    "PAD_ID", "BOS_ID", "EOS_ID", "MASK_ID", "UNK_ID",
    "SPECIAL_TOKENS", "N_SPECIAL_TOKENS", "IGNORE_INDEX",
}  # fmt: skip


def _modules() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE.parent)): ast.parse(p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _imports(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_tokenization_is_one_folder():
    for path, tree in _modules().items():
        if path.startswith("smiexlm/tokenizer/"):
            continue
        assert not Path(path).stem.startswith(("tokenizer", "vocab")), path
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            names |= {e.id for t in targets if isinstance(t, ast.Tuple) for e in t.elts}
            assert not names & SPECIAL_NAMES, (path, names & SPECIAL_NAMES)
        for node in ast.walk(tree):  # -100 is written as IGNORE_INDEX
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                assert getattr(node.operand, "value", None) != 100, (path, node.lineno)


def test_tokenizer_package_sits_below_the_rest():
    allowed = ("smiexlm.tokenizer", "smiexlm.errors", "smiexlm.paths")
    for path, tree in _modules().items():
        if path.startswith("smiexlm/tokenizer/"):
            project = {m for m in _imports(tree) if m.startswith("smiexlm")}
            assert all(m.startswith(allowed) for m in project), (path, project)


def test_training_does_not_import_the_text_adapter():
    for path, tree in _modules().items():
        if path.startswith("smiexlm/training/"):
            assert not any(m.startswith("smiexlm.text") for m in _imports(tree)), path


def test_each_helper_has_one_definition():
    defined = Counter(
        node.name
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.col_offset == 0
    )
    for name in ("file_sha256", "token_budget_batches", "iter_smiles", "split_smiles_line",
                 "resolve_device", "morgan_fingerprints", "load_tokenizer"):  # fmt: skip
        assert defined[name] == 1, name
    assert defined["load_checkpoint"] == 0  # each loader's name says what it loads
    morgan = [
        path
        for path, tree in _modules().items()
        if any(
            isinstance(node, ast.Attribute) and node.attr == "GetMorganGenerator"
            for node in ast.walk(tree)
        )
    ]
    assert morgan == ["smiexlm/fingerprints.py"]
