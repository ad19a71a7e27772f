"""Every script under ``benchmarks/`` runs at a tiny size, so that a recorded figure stays
reproducible.

Each figure in ``benchmarks/results/`` comes from one of these scripts; one that no longer runs
(an API it calls has moved, the default model's embedding has changed width) leaves a figure
nobody can reproduce. Each test runs one script, or a short chain (a run, then the script that
reads it), as a subprocess with the smallest arguments it accepts, writing only under pytest's
temporary folder, and checks its exit code and the output it exists for. The runs go two at a
time: about 9 of the suite's 23 minutes on 2 cores, beside the other worker's tests. ``benchmarks/gpu/`` is covered by its CPU
dry run (``tests/integration/test_gpu_campaign.py``). With ``SMOKE_TIMES=FILE`` set, each
step's seconds are written to FILE as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port, some_data

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Step:
    """``python benchmarks/<script> <args>``; ``{tmp}`` and ``{port}`` in the arguments are
    the chain's folder and a free TCP port. ``expect``: files under ``{tmp}`` it must write;
    ``prints``: text its standard output must hold. ``data``: when given, the step's
    ``SMIEXLM_DATA`` holds only these files of the shared folder (linked into ``{tmp}/data``)."""

    script: str
    args: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    prints: str = ""
    data: tuple[str, ...] = ()


MN = "moleculenet_table.py"
# chain name -> steps, the longest chains first (they are started first)
SMOKE: dict[str, list[Step]] = {
    "corpus_coverage": [
        # the exclusion keys of BACE alone: those of every MoleculeNet file take minutes
        Step("corpus_coverage.py", ("--sample", "200", "--fraction", "0.2", "--sets", "bace",
             "--workdir", "{tmp}/work", "--out", "{tmp}/coverage.md"),
             expect=("coverage.md",), prints="| BACE |",
             data=("moleculenet/bace.csv", "pretrain/moses_train.smi.gz")),
    ],
    "pretrain_throughput+precision_curves": [
        # a one-process and a two-process launch (the other two differ by a precision word)
        Step("pretrain_throughput.py", ("--steps", "1", "--molecules", "200", "--max-tokens",
             "512", "--launch", "--launch-steps", "10", "--launch-modes", "1_fp32", "2_bf16",
             "--keep", "{tmp}/runs"),
             expect=("runs/1_fp32/metrics.jsonl", "runs/2_bf16/metrics.jsonl"),
             prints="2 processes, bf16 autocast (default)"),
        Step("precision_curves.py", ("{tmp}/runs/1_fp32", "{tmp}/runs/2_bf16", "--out",
             "{tmp}/curves.png", "--every", "5"), expect=("curves.png",), prints="| 5 |"),
    ],
    "moleculenet_table+conformal_coverage+applicability_domain": [
        Step(MN, ("run", "--name", "shipped", "--tasks", "bace", "--seeds", "0",
             "--max-train-steps", "2", "--out", "{tmp}/run"),
             expect=("run/results.json", "run/runs/bace/seed0/result.json",
                     "run/runs/bace/seed0/history.json"),
             prints="shipped bace seed 0: test"),
        Step(MN, ("curves", "{tmp}/run", "--tasks", "bace", "--seeds", "0", "--out",
             "{tmp}/curves.png"), expect=("curves.png",), prints="1 cells"),
        Step("conformal_coverage.py", ("{tmp}/run", "--out", "{tmp}/conformal", "--resplits",
             "2"), expect=("conformal/report.md", "conformal/coverage.csv",
             "conformal/reliability_run_bace.png"), prints="| bace | 0 | run | 0.1 | mondrian |"),
        Step("applicability_domain.py", ("{tmp}/run", "--out", "{tmp}/domain"),
             expect=("domain/report.md", "domain/domain.csv", "domain/domain.png"),
             prints="| bace | 1 | 152 |"),
        # two poolings side by side, not the shipped three: each is a pass over the set
        Step(MN, ("probe", "--tasks", "bace", "--seeds", "0", "--pooling", "cls+mean", "--out",
             "{tmp}/probe"), expect=("probe/results.json",)),
        Step(MN, ("baseline", "--tasks", "bace", "--seeds", "0", "--n-trees", "5", "--out",
             "{tmp}/rf"), expect=("rf/results.json",)),
        Step(MN, ("merge", "{tmp}/run", "{tmp}/probe", "{tmp}/rf", "--out", "{tmp}/table"),
             expect=("table/report.md",)),
        # the probe and the forests keep their predictions as fine-tuning does
        Step("conformal_coverage.py", ("{tmp}/probe", "{tmp}/rf", "--out", "{tmp}/rows",
             "--resplits", "2"), expect=("rows/coverage.csv",), prints="| bace | 0 | rf |"),
        Step("forest_blend.py", ("{tmp}/run", "--forests", "ecfp4", "--forest-root",
             "{tmp}/forests", "--n-trees", "5", "--third", "{tmp}/probe", "--keep",
             "{tmp}/kept", "--out", "{tmp}/blend"),
             expect=("blend/blend.md", "forests/ecfp4_5trees/bace/seed0/predictions.npz",
                     "kept/run+ecfp4/bace/seed0/predictions.npz"),
             prints="| run | bace | ecfp4 | 1 |"),
        Step("forest_blend.py", ("{tmp}/run", "--partner", "{tmp}/probe", "--out",
             "{tmp}/blend_probe"), expect=("blend_probe/blend.md",),
             prints="| run | bace | probe | 1 |"),
        Step("seed_ensemble.py", ("{tmp}/run", "--tasks", "bace", "--seeds", "0", "--forest",
             "ecfp4", "--forest-root", "{tmp}/forests", "--n-trees", "5", "--out",
             "{tmp}/ensemble"), expect=("ensemble/ensemble.md",), prints="| mean of 1 |"),
        # every calibration of predict --conformal-method on the served blend of the run
        Step("conformal_shift.py", ("--classification", "{tmp}/run", "--forest", "{tmp}/rf",
             "--sets", "bace", "--seeds", "0", "--resplits", "2", "--out", "{tmp}/shift"),
             expect=("shift/shift.md", "shift/shift.csv"), prints="| bace | 0.1 | distance |"),
        # the wide ensemble's rows, every member row named (one fine-tuned and two forest rows)
        Step("wide_ensemble.py", ("table", "--root", "{tmp}", "--default", "{tmp}/run",
             "--default-rdkit2d", "{tmp}/run", "--rf-rdkit2d", "{tmp}/rf", "--rf-both", "{tmp}/rf",
             "--rf-ecfp4", "{tmp}/forests/ecfp4_5trees", "--sets", "bace", "--seeds", "0",
             "--draws", "20", "--out", "{tmp}/wide"), expect=("wide/table.md",),
             prints="| mean of all 1 sets |"),
        # the classification kernel members' cells, and the rows with them
        Step("wide_ensemble.py", ("kernels", "--default", "{tmp}/run", "--sets", "bace",
             "--seeds", "0", "--out-root", "{tmp}/kernels")),
        Step("wide_ensemble.py", ("table", "--root", "{tmp}", "--default", "{tmp}/run",
             "--default-rdkit2d", "{tmp}/run", "--rf-rdkit2d", "{tmp}/rf", "--rf-both", "{tmp}/rf",
             "--rf-ecfp4", "{tmp}/forests/ecfp4_5trees", "--kernels", "{tmp}/kernels", "--sets",
             "bace", "--seeds", "0", "--draws", "20", "--out", "{tmp}/wide_kernels"),
             expect=("wide_kernels/table.md",), prints="| wide + SVC-both |"),
        # a fine-tuned row against a forest kept by forest_blend.py (<set>/seed<k>/ layout)
        Step(MN, ("compare", "{tmp}/run", "{tmp}/forests/ecfp4_5trees", "--tasks", "bace",
             "--seeds", "0", "--draws", "20", "--out", "{tmp}/compare.md"),
             expect=("compare.md",), prints="| bace | 152 |"),
        # the blend forest_blend.py kept against the forest alone
        Step(MN, ("compare", "{tmp}/kept/run+ecfp4", "{tmp}/forests/ecfp4_5trees", "--tasks",
             "bace", "--seeds", "0", "--draws", "20", "--measure", "pr_auc"),
             prints="| bace | 152 |"),
        Step(MN, ("campaign", "--root", "{tmp}/campaign", "--rows", "rf_ecfp4", "--tasks",
             "bace", "--seeds", "0", "--n-trees", "2"),
             expect=("campaign/report.md", "campaign/rf_ecfp4/runs/bace/seed0/result.json")),
        Step(MN, ("status", "--root", "{tmp}/campaign", "--rows", "rf_ecfp4", "default",
             "--tasks", "bace", "--seeds", "0"),
             prints="1 finished, 0 finished with other settings, 0 stopped, 1 not started"),
        # the cell records its PR-AUC itself: nothing to add
        Step(MN, ("measures", "--root", "{tmp}/campaign"),
             prints="0 cells given their measures; 0 kept no predictions"),
    ],
    "finetune_parallel": [
        Step("finetune_parallel.py", ("--task", "bace", "--epochs", "1", "--max-train-steps",
             "2", "--ways", "1 process, 1 thread", "2 processes, 1 thread each", "--out",
             "{tmp}/parallel"),
             expect=("parallel/parallel.json",), prints="| 2 processes, 1 thread each |"),
    ],
    "tta_cost": [Step("tta_cost.py", ("--n", "20", "--tta", "0", "2", "--train", "30",
                      "--forest", "rdkit2d", "--forest-trees", "5"),
                      prints="| 0, with the domain and a forest on rdkit2d (5 trees) |")],
    "hpopt_gain": [
        Step("hpopt_gain.py", ("--tasks", "bace", "--trials", "2", "--seeds", "0",
             "--max-train-steps", "2", "--out", "{tmp}/gain", "--table8-runs", "{tmp}/t8"),
             expect=("gain/gain.md", "gain/bace/search/best.toml", "t8/bace/seed0/result.json"),
             prints="| bace | Table 8 |"),
    ],
    "hpopt_workers": [
        Step("hpopt_workers.py", ("--task", "bace", "--trials", "2", "--max-train-steps", "2",
             "--out", "{tmp}/scale"), expect=("scale/hpopt_workers.md",), prints="ratio:",
             data=("moleculenet/bace.csv",)),
    ],
    "embed_resume+search": [
        Step("embed_resume.py", ("--n", "200", "--part-rows", "10", "--kill-after", "2",
             "--check", "20", "--keep", "{tmp}/emb", "--port", "{port}", "--json",
             "{tmp}/resume.json"), expect=("resume.json", "emb/manifest.json")),
        Step("search.py", ("--embeddings", "{tmp}/emb", "--queries", "20", "--ef", "16",
             "--ecfp4-queries", "5", "--json", "{tmp}/search.json"), expect=("search.json",)),
    ],
    "embed_parts": [
        Step("embed_parts.py", ("--sizes", "60", "--part-rows", "20", "--modes",
             "1 proc x 1 thread", "2 procs x 1 thread", "ray 2 nodes x 1 cpu", "--port",
             "{port}", "--json", "{tmp}/parts.json"), expect=("parts.json",),
             prints='"startup_s"'),
    ],
    "finetune_speed": [
        Step("finetune_speed.py", ("--before-rev", "HEAD", "--before-steps", "1",
             "--after-steps", "1", "--out", "{tmp}/speed"), expect=("speed/speed.json",)),
    ],
    "onnx_speed": [
        Step("onnx_speed.py", ("--n", "20", "--repeats", "1", "--threads", "1"),
             prints="| 1 | mean |"),
    ],
    "featurize_served": [
        Step("featurize_served.py", ("--n", "30", "--repeats", "1", "--threads", "1", "--profile"),
             prints="| MatMul |"),
    ],
    "neighbours": [
        Step("neighbours.py", ("--tasks", "bace", "--poolings", "cls", "-k", "5"),
             prints="| ECFP4 Tanimoto |"),
    ],
    "dag_loss": [Step("dag_loss.py", ("--smoke",), prints="text+gather B2 V30k")],
    "model_speed": [
        Step("model_speed.py", ("--presets", "tiny", "--steps", "1", "--max-len", "16"),
             prints="| tiny | exlm k=2 |"),
        Step("model_speed.py", ("--text", "--steps", "1", "--blocks", "2"),
             prints="| text tiny | exlm k=4, matmul DAG |"),
    ],
    "potency_members": [
        Step(MN, ("run", "--name", "shipped", "--tasks", "freesolv", "--seeds", "0",
             "--max-train-steps", "2", "--out", "{tmp}/reg"),
             expect=("reg/runs/freesolv/seed0/predictions.npz",)),
        Step("potency_members.py", ("--runs", "{tmp}/reg", "--sets", "freesolv", "--n-trees",
             "5", "--out", "{tmp}/potency"), expect=("potency/report.md", "potency/freesolv.json"),
             prints="| oof-best |"),
    ],
    "network_oof": [
        # the network fine-tuned in each of five folds (2 steps), against the kept scores
        Step("network_oof.py", ("--sets", "freesolv", "--seeds", "0", "--max-train-steps", "2",
             "--n-trees", "5", "--work", "{tmp}/work", "--out", "{tmp}/oof"),
             expect=("oof/report.md", "oof/freesolv-seed0.json"), prints="| freesolv | 0 |"),
    ],
    "potency_screens": [
        Step("potency_screens.py", ("gp-spread", "--sets", "freesolv", "--out", "{tmp}/screens"),
             expect=("screens/gp_spread.md",)),
        Step("potency_screens.py", ("descriptors", "--sets", "freesolv", "--out",
             "{tmp}/screens"), expect=("screens/descriptors/report.md",)),
        Step("potency_screens.py", ("trees", "--member", "forest-cv", "--max-features", "1.0",
             "0.5", "--in-place-of-forest", "--sets", "freesolv", "--out", "{tmp}/screens"),
             expect=("screens/trees-forest-cv-as-forest/report.md",)),
    ],
    "mordred_screen": [
        # both targets on 40 molecules, 2 updates each, FreeSolv fine-tuned for 2 steps
        Step("mordred_screen.py", ("--molecules", "40", "--valid-molecules", "10", "--updates",
             "2", "--pretrain-set", "max_tokens=256", "--sets", "freesolv", "--max-train-steps",
             "2", "--work", "{tmp}/work",
             "--out", "{tmp}/mordred"), expect=("mordred/report.md", "mordred/screen.json"),
             prints="| mordred |"),
        # what finetune serves from the Mordred model: 2 steps, a forest of 10 trees
        Step("backbone_served.py", ("--checkpoint", "{tmp}/work/model_mordred", "--sets",
             "freesolv", "--set", "max_train_steps=2", "--set", "forest_trees=10", "--work",
             "{tmp}/served_work", "--out", "{tmp}/served"), expect=("served/served.md",),
             prints="| freesolv (seeds 0), another backbone |"),
    ],
    "members_cost": [
        Step("members_cost.py", ("--task", "freesolv", "--predict-rows", "20", "--set",
             "max_train_steps=2", "--set", "forest_trees=10", "--out", "{tmp}/cost"),
             expect=("cost/members_cost.md",), prints="| served: + kernels |"),
    ],
    "tokenizer": [Step("tokenizer.py", ("--n", "200", "--repeats", "1"), prints="DeepChem")],
    "featurize": [
        Step("featurize.py", ("--n", "40", "--repeats", "1", "--threads", "1"),
             prints="RDKit Morgan fingerprints"),
    ],
    "batch_invariance": [
        Step("batch_invariance.py", ("--n", "30", "--repeats", "1"),
             prints="| served (batch_invariant) |"),
    ],
    "glue_table": [
        Step("glue_table.py", ("run", "--name", "tiny", "--checkpoint", "{tmp}/text_model",
             "--out", "{tmp}/glue", "--tasks", "RTE", "--seeds", "1", "--max-steps", "2",
             "--max-train-rows", "16", "--max-eval-rows", "16"), expect=("glue/RTE.json",)),
        Step("glue_table.py", ("merge", "{tmp}/glue", "--out", "{tmp}/table"),
             expect=("table/table.md", "table/glue.png")),
    ],
    "demo_pooling": [
        Step("demo_pooling.py", ("--corpus", "300", "--poolings", "cls"),
             prints="| -1 | cls | whitened |"),
    ],
    "embed_memory": [
        Step("embed_memory.py", ("--sizes", "40", "--scratch", "{tmp}/scratch"),
             prints="| 40 |"),
    ],
    "preprocess": [
        Step("preprocess.py", ("--n-canon", "60", "--n-fast", "200"),
             prints="pipeline, canonicalize, 2 workers"),
        Step("preprocess.py", ("--descriptors", "40"), prints="--descriptors rdkit2d, 2 workers"),
    ],
}  # fmt: skip


def _env(step: Step, folder: Path) -> dict[str, str]:
    # one thread per process (two runs share the cores); no __pycache__ in benchmarks/
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
                        "PYTHONDONTWRITEBYTECODE": "1", "TQDM_DISABLE": "1"}  # fmt: skip
    if step.data:
        env["SMIEXLM_DATA"] = str(some_data(Path(env["SMIEXLM_DATA"]), folder / "data", step.data))
    return env


def _run_chain(name: str, folder: Path) -> list[subprocess.CompletedProcess]:
    """The chain's steps in order, in ``folder``; stops at the first that fails."""
    from tests.cli.test_glue_cli import make_tiny_text_model

    folder.mkdir(parents=True)
    if name == "glue_table":
        make_tiny_text_model(folder / "text_model")
    if name.startswith("pretrain_throughput"):
        (folder / "runs").mkdir()
    done = []
    for step in SMOKE[name]:
        fill = {"tmp": str(folder), "port": str(free_port())}
        args = [a.format(**fill) for a in step.args]
        start = time.perf_counter()
        done.append(subprocess.run([sys.executable, str(BENCHMARKS / step.script), *args],
                                   capture_output=True, text=True, timeout=900,
                                   env=_env(step, folder),
                                   cwd=folder))  # fmt: skip
        done[-1].seconds = time.perf_counter() - start  # type: ignore[attr-defined]
        if done[-1].returncode != 0:
            break
    return done


def _tree(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def _selected_chains(request) -> set[str]:
    """The chains of this module's tests that the session runs (all when it runs none)."""
    chosen = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None:
            chosen.add(callspec.params["chain"])
    return chosen or set(SMOKE)


@pytest.fixture(scope="module")
def smoke_runs(request, shared_data, tmp_path_factory):
    """The chains the session selected, two at a time: ``{name: (folder, runs)}``, and the
    benchmarks/ tree before and after."""
    chosen = _selected_chains(request)
    root = tmp_path_factory.mktemp("smoke")
    before = _tree(BENCHMARKS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run_chain, name, root / name.replace("+", "_"))
                   for name in SMOKE if name in chosen}  # fmt: skip
        runs = {name: (root / name.replace("+", "_"), f.result()) for name, f in futures.items()}
    if os.environ.get("SMOKE_TIMES"):  # where the time goes: {chain: [seconds of each step]}
        times = {name: [round(p.seconds, 1) for p in done] for name, (_, done) in runs.items()}
        Path(os.environ["SMOKE_TIMES"]).write_text(json.dumps(times, indent=1), encoding="utf-8")
    return runs, before, _tree(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("chain", list(SMOKE))
def test_benchmark_runs_at_a_tiny_size(chain, smoke_runs):
    runs, _, _ = smoke_runs
    folder, done = runs[chain]
    for step, proc in zip(SMOKE[chain], done, strict=False):
        shown = f"{step.script} {' '.join(step.args)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, shown
        assert step.prints in proc.stdout, shown
        missing = [name for name in step.expect if not (folder / name).exists()]
        assert not missing, f"{step.script} did not write {missing}\n{shown}"
    assert len(done) == len(SMOKE[chain])


@pytest.mark.slow
@pytest.mark.data
def test_smoke_runs_leave_the_benchmarks_folder_as_it_was(smoke_runs):
    _, before, after = smoke_runs
    assert after == before  # nothing written into benchmarks/results/ (or anywhere in it)


def test_every_benchmark_script_has_a_smoke_run():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    covered = {step.script for steps in SMOKE.values() for step in steps}
    assert scripts == covered, f"without a smoke run: {sorted(scripts - covered)}"
    assert (BENCHMARKS / "gpu" / "campaign.py").is_file()  # its dry run is tested on its own
