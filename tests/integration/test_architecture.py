"""The package's shape: tokenization in one folder, one home per helper, layers that hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "smiexlm"


def test_no_import_goes_up_a_layer():
    """The layers of ``[tool.importlinter]`` in pyproject.toml hold, every import counted (at
    module level, in functions and under ``TYPE_CHECKING``): ``lint-imports`` keeps them."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_top_level_holds_the_shared_ground_and_packages():
    """Besides ``__init__``, the package's top level keeps the five modules every layer imports
    (errors, paths, atomic writes, settings, device); everything else sits in the package of
    its layer (docs/architecture.md)."""
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert loose == ["atomic", "device", "errors", "paths", "settings"], loose


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


def test_the_network_reads_and_writes_no_model_folder():
    """``smiexlm.model`` (the network) imports nothing of ``smiexlm.modelio`` (model folders),
    not even in a function: ``ExLMModel.from_pretrained`` and ``save_pretrained`` ask
    :mod:`smiexlm.core.hooks` for the folder code, which the package root names."""
    for path, tree in _modules().items():
        if path.startswith("smiexlm/model/"):
            found = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
            names = {a.name for n in found if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in found if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(m.startswith("smiexlm.modelio") for m in names), path


def test_each_helper_has_one_definition():
    defined = Counter(
        node.name
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.col_offset == 0
    )
    for name in ("file_sha256", "token_budget_batches", "iter_smiles", "split_smiles_line",
                 "resolve_device", "morgan_fingerprints", "load_tokenizer", "load_pretrained",
                 "load_finetuned", "read_normalization", "read_embedding", "read_finetune_meta",
                 "read_onnx_manifest", "load_whitening", "save_whitening", "model_folder",
                 "shipped_models", "is_shipped", "is_default", "pooling_parts", "load_tensors",
                 "pad_rows", "pad_flat", "collate", "check_text"):  # fmt: skip
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
    assert morgan == ["smiexlm/chemistry/fingerprints.py"]


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
    weights; ``load_finetuned`` loads a fine-tuned backbone through it); only a training
    resume, which restores a run's state, reads weights itself. Their files are read by one
    reader, ``ModelFolder`` (``FinetunedFolder`` for ``finetune.json``): nobody else opens a
    folder's config or ``finetune.json`` (``ExLMConfig.load``, ``read_finetune_meta``), nor
    builds a ``Pretrained`` or a folder reader of its own kind."""

    def called(name: str, owner: str | None = None):
        def calls(node: ast.AST) -> bool:
            if not isinstance(node, ast.Call):
                return False
            func = node.func
            if owner is None:
                return isinstance(func, ast.Name) and func.id == name
            return (
                isinstance(func, ast.Attribute)
                and func.attr == name
                and isinstance(func.value, ast.Name)
                and func.value.id == owner
            )

        return calls

    homes = set(_where(called("from_pretrained", "ExLMModel")))
    assert homes == {"smiexlm/modelio/pretrained.py", "smiexlm/pretraining/sharded.py"}, homes
    assert set(_where(called("read_finetune_meta"))) == {"smiexlm/modelio/folder.py"}
    assert set(_where(called("load_whitening"))) == {"smiexlm/modelio/folder.py"}
    assert set(_where(called("read_onnx_manifest"))) == {
        "smiexlm/modelio/folder.py",
        "smiexlm/embedding/onnx_export.py",  # the writer keeps the other graphs' records
    }
    # config.json of a model folder: its reader and the loader (which checks it against the
    # weights before allocating); a training checkpoint's config is read by its own resume.
    assert set(_where(called("load", "ExLMConfig"))) == {
        "smiexlm/modelio/folder.py",
        "smiexlm/modelio/weights.py",
    }, _where(called("load", "ExLMConfig"))


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _import_graph() -> dict[str, dict[str, bool]]:
    """Module -> {imported module: whether every import of it sits under ``if
    TYPE_CHECKING:``}, counting imports inside functions; names imported from a package
    resolve to its module when there is one (``from smiexlm.model import folder``)."""
    trees = {_module_name(path): tree for path, tree in _modules().items()}
    graph: dict[str, dict[str, bool]] = {}
    for name, tree in trees.items():
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for inner in ast.walk(node)
        }
        edges: dict[str, bool] = {}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in trees else node.module
                    for a in node.names
                ]
            for target in targets:
                if target in trees and target != name:
                    edges[target] = edges.get(target, True) and id(node) in typing_only
        graph[name] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    """``smiexlm.model`` for ``smiexlm.modelio.folder``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def test_imports_form_no_circle_across_packages():
    """The packages stack up: no import circle spans two packages (every import counted, in
    functions and under ``if TYPE_CHECKING:`` too). Inside one package a circle may stay only
    when an ``if TYPE_CHECKING:`` import closes it. The CLI and the package's ``__init__``
    sit on top: they may import anything."""
    graph = _import_graph()
    top = {m for m in graph if m == "smiexlm" or m.startswith("smiexlm.cli")}
    every = {m: set(edges) - top for m, edges in graph.items() if m not in top}
    across = [c for c in _circles(every) if len({_package(m) for m in c}) > 1]
    assert across == [], across
    real = {m: {t for t, typing in graph[m].items() if not typing} & set(every) for m in every}
    assert _circles(real) == [], _circles(real)
    packages: dict[str, set[str]] = {}  # and no circle of packages: they stack up
    for module, edges in every.items():
        packages.setdefault(_package(module), set()).update(
            _package(t) for t in edges if _package(t) != _package(module)
        )
    assert _circles(packages) == [], _circles(packages)


def test_moleculenet_keeps_the_sets_and_their_scores():
    """``smiexlm.moleculenet`` holds the sets, splits, metrics, run cells and
    reports; fine-tuning, forests and serving sit in packages of their own."""
    kept = {"__init__", "registry", "loaders", "task", "splits", "metrics", "cliffs", "compare",
            "runs", "score_store", "report"}  # fmt: skip
    found = {p.stem for p in (PACKAGE / "moleculenet").glob("*.py")}
    assert found == kept, found ^ kept


def _strings(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of a module, docstrings and other bare strings left out."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare
    ]


def test_model_folder_file_names_have_one_home():
    """Every file name of a model folder is written as a string once, in
    ``smiexlm/modelio/layout.py``; a module that spells ``"config.json"`` or
    ``"finetune.json"`` itself is a second reader (or writer) of the folder. ``vocab.json``
    and ``descriptors.json`` are dataset files too, named where the dataset side reads them."""
    from smiexlm.modelio.layout import FILES

    homes = {
        "vocab.json": "smiexlm/paths.py",
        "descriptors.json": "smiexlm/chemistry/descriptor_stats.py",
    }
    for path, tree in _modules().items():
        for node in _strings(tree):
            if node.value in FILES:
                home = homes.get(node.value, "smiexlm/modelio/layout.py")
                assert path == home, (path, node.lineno, node.value)


def test_the_shipped_default_model_is_recognised_in_one_place():
    """Whether a folder is the shipped default model is asked of ``layout.is_default`` (or
    ``ModelFolder.is_default``) alone: no other module names the default model's folder."""
    for path, tree in _modules().items():
        if path == "smiexlm/modelio/layout.py":
            continue
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "DEFAULT_MODEL_DIR" not in names, path
        assert not any("default_model" in n.value for n in _strings(tree)), path


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
    by ``smiexlm.data.readers`` alone (its LMDB archives by ``lmdb_input``, which it calls and
    which holds the one unpickling): it owns the suffix table, the SMILES-column rule and
    the error messages. Any other module that opens such a file with pandas, pyarrow, gzip,
    csv or lmdb is a second home of the concept, whatever its functions are called.

    The others below read files of their own making or no molecules at all:
    ``parts/`` its own Parquet parts (and their schema); ``search.py`` its index's own
    ``library.parquet``; ``cli/embed.py`` the ``rejects.csv`` of a parts folder it wrote;
    ``moleculenet/score_store.py`` the compact scores it wrote beside a finished cell;
    ``text/blocks.py`` the text adapter's plain-text corpus (documents, not molecules).
    The list is exact, so a reader that goes away must leave it too."""
    homes = {p: _table_readers(tree) for p, tree in _modules().items()}
    homes = {p: found for p, found in homes.items() if found}
    readers = homes.pop("smiexlm/data/readers.py", set())
    assert {"pandas.read_csv", "pyarrow.parquet.ParquetFile", "csv.reader"} <= readers
    assert homes.pop("smiexlm/data/lmdb_input.py", set()) == {"lmdb.open"}
    assert homes == {
        "smiexlm/parts/writing.py": {"pyarrow.parquet.read_schema"},
        "smiexlm/parts/reading.py": {"pyarrow.parquet.read_table", "pyarrow.dataset.dataset"},
        "smiexlm/embedding/search.py": {"pyarrow.parquet.read_table"},
        "smiexlm/moleculenet/score_store.py": {"pyarrow.parquet.read_table"},
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
    """A process learns its rank and world size from ``smiexlm.training.ranks.detect`` alone, whether
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

    assert set(_where(names_a_variable)) == {"smiexlm/training/ranks.py"}, _where(names_a_variable)
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
    folder). The hybrid heads' scaler is ``forests/features.py``'s ``FeatureScaler``."""

    def computes(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in {
            "descList", "CalcMolDescriptors", "CalcMolDescriptors3D", "rdMolDescriptors",
        }  # fmt: skip

    assert set(_where(computes)) == {"smiexlm/chemistry/fingerprints.py"}, _where(computes)

    def makes_stats(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node.func) in {
            "DescriptorStats", "DescriptorStats.load", "DescriptorStats.from_dict",
        }  # fmt: skip

    assert set(_where(makes_stats)) == {"smiexlm/chemistry/descriptor_stats.py"}, _where(
        makes_stats
    )


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


# What is still over the limits, named so the lists only shrink: a module or function that
# grows past them fails, one that comes back under must leave its list.
LONG_MODULES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def test_modules_stay_within_400_lines_and_functions_within_60():
    """No module over 400 lines and no function over 60 (the Triton kernels aside), but for
    the ones :data:`LONG_MODULES` and :data:`LONG_FUNCTIONS` still name."""
    long_modules, long_functions = set(), set()
    for path, tree in _modules().items():
        if len((PACKAGE.parent / path).read_text().splitlines()) > 400:
            long_modules.add(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.end_lineno - node.lineno + 1 > 60 and not path.endswith("triton_kernels.py")
            ):
                long_functions.add(f"{path}:{node.name}")
    assert long_modules == LONG_MODULES
    assert long_functions == LONG_FUNCTIONS
