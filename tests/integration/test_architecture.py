"""The package's shape: tokenization in one folder, one home per helper, layers that hold."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "smiexlm"
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
                 "resolve_device", "morgan_fingerprints", "load_tokenizer", "load_pretrained",
                 "read_normalization", "pad_rows", "pad_flat", "collate", "check_text"):  # fmt: skip
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


def _where(predicate) -> dict[str, list[int]]:
    """Module -> line numbers of the AST nodes for which ``predicate`` holds."""
    found: dict[str, list[int]] = {}
    for path, tree in _modules().items():
        lines = [node.lineno for node in ast.walk(tree) if predicate(node)]
        if lines:
            found[path] = lines
    return found


def test_one_home_loads_a_model_folder():
    """Model folders are loaded by ``load_pretrained`` (tokenizer and normalisation with the
    weights); only a training resume, which restores a run's state, reads weights itself."""

    def loads_weights(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "from_pretrained"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "ExLMModel"
        )

    homes = set(_where(loads_weights))
    assert homes == {"smiexlm/model/pretrained.py", "smiexlm/training/sharded.py"}, homes


def test_one_home_pads_token_rows():
    """A (B, T) mask from row lengths (``arange(T) < lengths[:, None]``) is built only by
    the padder; the model's own geometry (ExLM expansion, masking, DAG) is not input padding."""

    def pads(node: ast.AST) -> bool:
        if not isinstance(node, ast.Compare) or not isinstance(node.ops[0], ast.Lt):
            return False
        left, right = ast.unparse(node.left), ast.unparse(node.comparators[0])
        return "arange(" in left and right.endswith("[:, None]")

    homes = {p for p in _where(pads) if not p.startswith(("smiexlm/model/", "smiexlm/dag/"))}
    assert homes == {"smiexlm/tokenizer/padding.py"}, homes


def test_one_home_normalises_and_tokenizes_model_inputs():
    """SMILES reach a model through ``ModelInputs``: outside the tokenizer package nobody
    else calls ``encode_many`` (the tokenizer's batch entry point) but the text adapter's
    corpus builder, which streams plain text, not molecules."""

    def encodes(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "encode_many"
        )

    homes = {p for p in _where(encodes) if not p.startswith("smiexlm/tokenizer/")}
    homes.discard("smiexlm/text/blocks.py")
    assert homes == {"smiexlm/model/inputs.py"}, homes


# pandas, pyarrow and the standard library's ways of opening a table file or a compressed one.
TABLE_READERS = {
    "pandas.read_csv", "pandas.read_table", "pandas.read_parquet", "pandas.read_fwf",
    "pandas.read_excel", "pandas.read_feather", "pyarrow.csv.read_csv", "pyarrow.csv.open_csv",
    "pyarrow.parquet.read_table", "pyarrow.parquet.ParquetFile", "pyarrow.parquet.ParquetDataset",
    "pyarrow.parquet.read_schema", "pyarrow.dataset.dataset", "gzip.open", "gzip.GzipFile",
    "csv.reader", "csv.DictReader", "lmdb.open",
}  # fmt: skip


def _table_readers(tree: ast.Module) -> set[str]:
    """The names of :data:`TABLE_READERS` that a module imports or refers to, however spelled
    (``pd.read_csv``, ``from pyarrow import parquet as pq`` then ``pq.read_table``, ``from
    pandas import read_csv``), called or passed around (``opener = gzip.open``)."""
    aliases: dict[str, str] = {}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = name
                found |= {name} & TABLE_READERS
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            head, _, rest = ast.unparse(node).partition(".")
            found |= {f"{aliases.get(head, head)}.{rest}"} & TABLE_READERS
    return found


def test_one_home_reads_tables():
    """A table of molecules (SMILES file, CSV/TSV, Parquet, LMDB; gzipped or not) is opened
    by ``smiexlm.data.readers`` alone: it owns the suffix table, the SMILES-column rule and
    the error messages. Any other module that opens such a file with pandas, pyarrow, gzip,
    csv or lmdb is a second home of the concept, whatever its functions are called.

    The others below read files of their own making or no molecules at all:
    ``parts/`` its own Parquet parts (and their schema); ``search.py`` its index's own
    ``library.parquet``; ``cli/embed.py`` the ``rejects.csv`` of a parts folder it wrote;
    ``text/blocks.py`` the text adapter's plain-text corpus (documents, not molecules).
    The list is exact, so a reader that goes away must leave it too."""
    homes = {p: _table_readers(tree) for p, tree in _modules().items()}
    homes = {p: found for p, found in homes.items() if found}
    readers = homes.pop("smiexlm/data/readers.py", set())
    assert {"pandas.read_csv", "pyarrow.parquet.ParquetFile", "csv.reader"} <= readers
    assert homes == {
        "smiexlm/parts/writing.py": {"pyarrow.parquet.read_schema"},
        "smiexlm/parts/reading.py": {"pyarrow.parquet.read_table", "pyarrow.dataset.dataset"},
        "smiexlm/search.py": {"pyarrow.parquet.read_table"},
        "smiexlm/cli/embed.py": {"csv.DictReader"},
        "smiexlm/text/blocks.py": {"gzip.open"},
    }, homes  # fmt: skip
    assert not (PACKAGE / "tables.py").exists()  # the old DataFrame reader beside readers.py
    defined = Counter(
        node.name
        for tree in _modules().values()
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    )
    for name in ("detect_format", "smiles_column", "iter_table", "read_table", "read_chunks"):
        assert defined[name] == 1, name


def test_one_home_makes_the_per_seed_result():
    """A seed's result record is made by ``MoleculeTask.result`` (fine-tuning, probe and
    baseline alike); ``report.py`` only reads records back from their JSON."""

    def makes_result(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "RunResult"
            and not any(isinstance(k.value, ast.BinOp) for k in node.keywords if k.arg is None)
        )

    assert set(_where(makes_result)) == {"smiexlm/moleculenet/task.py"}


# The variables torchrun (and ``launch_local``) set to tell a process its place in the job.
TORCHRUN_PLACE = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"}


def test_one_home_reads_the_torchrun_place():
    """A process learns its rank and world size from ``smiexlm.ranks.detect`` alone, whether
    it pretrains, fine-tunes or serves a batch job: no other module names one of the
    variables (``os.environ.get("RANK")``, ``os.getenv("WORLD_SIZE")``, a helper given the
    name) nor asks torch.distributed (``get_rank``, ``get_world_size``), which only knows once
    a process group exists. Setting them for a child process is a keyword (``RANK=...``),
    not a name, and stays allowed."""

    def names_a_variable(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in TORCHRUN_PLACE

    def asks_torch(node: ast.AST) -> bool:
        return isinstance(node, (ast.Attribute, ast.alias)) and (
            getattr(node, "attr", None) or getattr(node, "name", None)
        ) in {"get_rank", "get_world_size", "get_local_rank", "get_node_local_rank"}

    assert set(_where(names_a_variable)) == {"smiexlm/ranks.py"}, _where(names_a_variable)
    assert _where(asks_torch) == {}, _where(asks_torch)


HASHLIB_DIGESTS = {"sha256", "sha1", "sha512", "md5", "blake2b", "blake2s", "file_digest"}
FILE_READS = {"open", "read", "read_bytes", "readinto", "fromfile", "mmap"}


def _calls(node: ast.AST) -> set[str]:
    """The names called under ``node``: ``f`` of ``f(...)`` and ``m.f(...)`` alike, and
    ``hashlib.new`` as ``hashlib.new``."""
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            names.add(call.func.id)
        elif isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            names.add(ast.unparse(call.func) if call.func.attr == "new" else call.func.attr)
    return names


def test_one_home_hashes_files():
    """Files are hashed by ``smiexlm.paths.file_sha256`` alone (its ``each_block`` lets a
    caller learn more on the same pass, as the token shards' scan does). A function elsewhere
    that both reads a file and builds a digest (``hashlib.sha256()``, ``blake2b``,
    ``hashlib.new(...)``, ``file_digest``) is a second file hasher. Hashing bytes already in
    memory (a shard's payload before it is written, a vocabulary, a job's key) reads no file
    and stays allowed."""

    def hashes_a_file(node: ast.AST) -> bool:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        calls = _calls(node)
        return bool(calls & (HASHLIB_DIGESTS | {"hashlib.new"})) and bool(calls & FILE_READS)

    homes = _where(hashes_a_file)
    assert homes == {"smiexlm/paths.py": homes.get("smiexlm/paths.py", [])}, homes
    hasher = [n for n in ast.walk(_modules()["smiexlm/paths.py"]) if hashes_a_file(n)]
    assert [n.name for n in hasher] == ["file_sha256"]


def test_one_home_each_for_descriptors_and_their_scaling():
    """RDKit descriptors are computed in ``fingerprints.py`` alone (the baseline, the hybrid
    features and the pretraining targets call it), and the statistics of pretraining targets
    are made and read back in ``descriptor_stats.py`` alone (from a dataset folder or a model
    folder). The hybrid heads' scaler is ``moleculenet/features.py``'s ``FeatureScaler``."""

    def computes(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in {
            "descList", "CalcMolDescriptors", "CalcMolDescriptors3D", "rdMolDescriptors",
        }  # fmt: skip

    assert set(_where(computes)) == {"smiexlm/fingerprints.py"}, _where(computes)

    def makes_stats(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node.func) in {
            "DescriptorStats", "DescriptorStats.load", "DescriptorStats.from_dict",
        }  # fmt: skip

    assert set(_where(makes_stats)) == {"smiexlm/descriptor_stats.py"}, _where(makes_stats)


def test_a_module_exports_only_its_own_names():
    """Outside a package's ``__init__.py`` (its public face), a module imports a project
    name only to use it: an import kept for an old path (``from x import y as y``, a name
    listed in ``__all__`` but defined elsewhere, an import nothing in the module reads) makes
    a second address for one thing. Importers name the module that defines it."""
    for path, tree in _modules().items():
        if path.endswith("__init__.py"):
            continue
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smiexlm")
            for alias in node.names
        }
        read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert not imported - read, (path, sorted(imported - read))
        exported = [
            element.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            for element in getattr(node.value, "elts", [])
            if isinstance(element, ast.Constant)
        ]
        assert not set(exported) & imported, (path, sorted(set(exported) & imported))
