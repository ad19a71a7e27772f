"""``smiexlm embed --ray`` and ``predict --ray`` on a real two-node Ray cluster that this
module starts on loopback (``ray start --head`` and ``ray start --address``, one CPU each) and
stops: the parts table is bitwise the one-process table, also after a part writer is killed
with SIGKILL mid-run; a folder of Parquet files works; a second run writes nothing; bad
addresses and globs are one line; the models serve a Ray Data pipeline of one's own
(``EmbedBatches``, ``PredictBatches``)."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import LoopbackRayCluster, free_port, smiexlm_command

ENV = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, one CPU each, on loopback (:class:`LoopbackRayCluster`)."""
    with LoopbackRayCluster(nodes=2) as running:
        yield running


@pytest.fixture(scope="module")
def molecules(shared_data, tmp_path_factory) -> Path:
    """A CSV of 240 MOSES molecules (an id column, SMILES), one of them unparsable."""
    path = tmp_path_factory.mktemp("ray") / "in.csv"
    with gzip.open(shared_data / "pretrain" / "moses_test.smi.gz", "rt") as handle:
        smiles = [line.split()[0] for line, _ in zip(handle, range(241), strict=False)][1:]
    smiles[17] = "C1CC(("  # a bad row: NaN, and in rejects.csv
    pd.DataFrame({"id": [f"m{i}" for i in range(len(smiles))], "smiles": smiles}).to_csv(
        path, index=False
    )
    return path


@pytest.fixture(scope="module")
def one_process(molecules) -> pd.DataFrame:
    from smiexlm.parts.reading import read_parts

    out = molecules.parent / "local"
    _run(molecules, out)
    return read_parts(out).to_pandas()


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """A fine-tuned folder (two updates of a random network, with its forest)."""
    from tests.unit.finetuning.test_moleculenet_finetune import _finetune_cli, _small_csv

    root = tmp_path_factory.mktemp("finetuned")
    path, _ = _small_csv(root)
    _finetune_cli(path, root / "run", "--random-init", "--seeds", "0", "--save-dir",
                  str(root / "model"), forest=None)  # fmt: skip
    return root / "model"


def _command(source, out: Path, cluster: LoopbackRayCluster | None,
             model: Path | None = None) -> tuple[list[str], dict]:  # fmt: skip
    """``smiexlm embed`` of ``source`` into parts of 40 rows (``predict`` with ``model``):
    here, or on ``cluster``."""
    args = [smiexlm_command(), "embed", str(source), "--out", str(out), "--part-rows", "40"]
    if model is not None:
        args = [smiexlm_command(), "predict", "--checkpoint", str(model), "--input",
                str(source), "--out", str(out), "--part-rows", "40"]  # fmt: skip
    if cluster is None:
        return args, ENV
    return cluster.command([*args, "--ray", cluster.address]), cluster.env | ENV


def _run(
    source,
    out: Path,
    cluster: LoopbackRayCluster | None = None,
    model: Path | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    args, env = _command(source, out, cluster, model)
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_two_nodes_give_the_one_process_table(cluster, molecules, one_process, tmp_path):
    from smiexlm.parts.reading import read_manifest, read_parts

    out = tmp_path / "ray"
    _run(molecules, out, cluster)
    table = read_parts(out).to_pandas()
    pd.testing.assert_frame_equal(table, one_process, check_exact=True)
    manifest = read_manifest(out)
    assert manifest["n_failed"] == 1 and "C1CC((" in (out / "rejects.csv").read_text()
    assert len({w["worker"] for w in manifest["last_run"]["workers"]}) == 2  # both nodes wrote
    again = _run(molecules, out, cluster)
    assert "nothing to do" in again.stdout, again.stdout


@pytest.mark.slow
def test_predict_on_two_nodes_gives_the_one_process_table(cluster, molecules, finetuned,
                                                          tmp_path):  # fmt: skip
    from smiexlm.parts.reading import read_manifest, read_parts

    _run(molecules, tmp_path / "local", model=finetuned)
    _run(molecules, tmp_path / "ray", cluster, finetuned)
    table = read_parts(tmp_path / "ray").to_pandas()
    assert {"y", "y_model", "y_forest", "in_domain"} <= set(table.columns)
    pd.testing.assert_frame_equal(table, read_parts(tmp_path / "local").to_pandas(),
                                  check_exact=True)  # fmt: skip
    manifest = read_manifest(tmp_path / "ray")
    assert manifest["n_failed"] == 1 and len(manifest["last_run"]["workers"]) == 2


@pytest.mark.slow
def test_a_part_writer_killed_mid_run_is_restarted(cluster, molecules, one_process, tmp_path):
    from smiexlm.parts.reading import read_parts

    out = tmp_path / "killed"
    args, env = _command(molecules, out, cluster)
    run = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, killed = time.time() + 300, False
    while not killed and time.time() < deadline and run.poll() is None:
        if any(out.glob("part-*.parquet")):
            found = subprocess.run(["pgrep", "-f", "ray::PartWriter"], capture_output=True,
                                   text=True)  # fmt: skip
            ours = subprocess.run(["ip", "netns", "pids", cluster.netns], capture_output=True,
                                  text=True)  # fmt: skip
            pids = sorted(
                {int(p) for p in found.stdout.split()} & {int(p) for p in ours.stdout.split()}
            )
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed = True
        time.sleep(0.05)
    stdout, stderr = run.communicate(timeout=600)
    assert killed, "the run ended before a writer could be killed"
    assert run.returncode == 0, stderr[-3000:]
    pd.testing.assert_frame_equal(read_parts(out).to_pandas(), one_process, check_exact=True)


@pytest.mark.slow
def test_a_folder_of_parquet_files_named_relative_to_here(cluster, molecules, one_process,
                                                          tmp_path):  # fmt: skip
    """The writers, in working folders of their own, get the input and --out whole; a
    SMILES column the files lack is one line, before any folder is made."""
    from smiexlm.parts.reading import read_parts

    folder = tmp_path / "in"
    folder.mkdir()
    table = pd.read_csv(molecules, dtype=str, keep_default_na=False)
    for i, start in enumerate(range(0, len(table), 70)):
        table.iloc[start : start + 70].to_parquet(folder / f"chunk{i}.parquet", index=False)
    _run(Path("in"), Path("out"), cluster, cwd=tmp_path)
    pd.testing.assert_frame_equal(
        read_parts(tmp_path / "out").to_pandas(), one_process, check_exact=True
    )
    args, env = _command(folder, tmp_path / "other", cluster)
    done = subprocess.run([*args, "--smiles-col", "SMILES"], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and "'SMILES'" in lines[-1], done.stderr[-2000:]
    assert lines[-1].startswith("error:") and not (tmp_path / "other").exists(), lines


@pytest.mark.slow
def test_a_gzipped_smiles_file_with_odd_lines(cluster, molecules, tmp_path):
    """A ``.smi.gz`` whose lines hold a form feed, a lone carriage return and a Unicode line
    separator: the rows a run without Ray reads (split at newlines only), bitwise."""
    from smiexlm.parts.reading import read_parts

    table = pd.read_csv(molecules, dtype=str, keep_default_na=False)
    lines = [f"{s} {i}" for s, i in zip(table.smiles, table.id, strict=True)]
    lines[3] += "\fpage"
    lines[5] = lines[5].replace(" ", "\r", 1)
    lines[9] += "\u2028line"
    source = tmp_path / "in.smi.gz"
    source.write_bytes(gzip.compress(("\ufeff" + "\n".join(lines) + "\n\n").encode()))
    _run(source, tmp_path / "local")
    _run(source, tmp_path / "ray", cluster)
    local = read_parts(tmp_path / "local").to_pandas()
    assert len(local) == len(lines)
    pd.testing.assert_frame_equal(read_parts(tmp_path / "ray").to_pandas(), local,
                                  check_exact=True)  # fmt: skip


_WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed
from smiexlm.cli.main import main
sys.argv[0] = "smiexlm"
main()
"""


def test_bad_addresses_globs_and_no_ray_are_one_line(molecules, finetuned, tmp_path):
    predict = ["predict", "--checkpoint", str(finetuned), "--input"]
    out = ["--out", str(tmp_path / "o")]
    unreachable = ["--ray", f"127.0.0.1:{free_port()}"]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_bytes(molecules.read_bytes())
    (mixed / "b.csv.gz").write_bytes(gzip.compress(molecules.read_bytes()))
    cases = [
        ([smiexlm_command(), "embed", str(molecules), *out, *unreachable], "--ray '127.0.0.1:"),
        ([smiexlm_command(), *predict, str(molecules), *out, *unreachable], "--ray '127.0.0.1:"),
        ([smiexlm_command(), "embed", str(tmp_path / "none*.parquet"), *out, "--ray", "local"],
         "matches no file"),
        ([smiexlm_command(), *predict, str(tmp_path / "none*.csv"), *out, "--ray", "local"],
         "matches no file"),
        ([smiexlm_command(), "embed", str(molecules), "--out", str(tmp_path / "x.parquet"),
          "--ray", "local"], "folder of parts"),
        ([smiexlm_command(), "embed", str(mixed), *out, "--ray", "local"],
         "mixes gzip-compressed and plain files"),
        ([sys.executable, "-c", _WITHOUT_RAY, "embed", str(molecules), *out, "--ray", "local"],
         "pip install 'smiexlm[ray]'"),
        ([sys.executable, "-c", _WITHOUT_RAY, *predict, str(molecules), *out, "--ray", "auto"],
         "pip install 'smiexlm[ray]'"),
    ]  # fmt: skip
    for args, said in cases:
        done = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0 and said in lines[-1], done.stderr[-2000:]
        assert lines[-1].startswith("error:"), lines


_PIPELINE = """
import sys, pandas as pd, ray
from smiexlm.embedding.on_ray import EmbedBatches
from smiexlm.serving.on_ray import PredictBatches
address, source, model, out = sys.argv[1:]
ray.init(address=address, log_to_driver=False)
table = pd.read_csv(source).iloc[:50]
ds = ray.data.from_pandas(table).map_batches(
    EmbedBatches, fn_constructor_kwargs={"smiles_col": "smiles"}, batch_format="pandas",
    concurrency=1, num_cpus=1, batch_size=16)
ds.to_pandas().to_parquet(out + ".emb.parquet")
ds = ray.data.from_pandas(table).map_batches(
    PredictBatches, fn_constructor_kwargs={"checkpoint": model}, batch_format="pandas",
    concurrency=1, num_cpus=1, batch_size=16)
ds.to_pandas().to_parquet(out + ".pred.parquet")
"""


@pytest.mark.slow
def test_the_models_in_a_ray_data_pipeline_of_ones_own(cluster, molecules, finetuned, tmp_path):
    """``EmbedBatches`` and ``PredictBatches`` in a user's own ``map_batches``, in a driver
    of its own (Ray reads its token from the environment when it is imported)."""
    import numpy as np

    from smiexlm import Featurizer
    from smiexlm.serving.prediction import predict

    out = tmp_path / "mine"
    args = cluster.command([sys.executable, "-c", _PIPELINE, cluster.address, str(molecules),
                            str(finetuned), str(out)])  # fmt: skip
    done = subprocess.run(args, env=cluster.env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = pd.read_parquet(f"{out}.emb.parquet")
    expected = Featurizer.from_pretrained().featurize(list(got["smiles"]), errors="nan")
    columns = [c for c in got.columns if c.startswith("e") and c[1:].isdigit()]
    assert np.array_equal(got[columns].to_numpy(np.float32), expected, equal_nan=True)
    assert got.loc[17, "embed_error"] and not got.loc[0, "embed_error"]
    got = pd.read_parquet(f"{out}.pred.parquet")
    expected = predict(finetuned, list(got["smiles"]))
    assert got["id"].tolist() == [f"m{i}" for i in range(50)]
    assert np.array_equal(got["y"].to_numpy(float), expected["y"].to_numpy(float), equal_nan=True)
    assert got["valid"].tolist() == expected["valid"].tolist()
    assert got.loc[17, "predict_error"] and not got.loc[0, "predict_error"]
