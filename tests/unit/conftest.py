"""The ``precision`` marker of the unit tests, and its guard.

CI runs the unit tests a second time with ``SMIEXLM_NATIVE_BF16`` flipped (see ``.ci/run``),
so that the bf16 and the fp32 paths both pass. The switch is read in one place,
:func:`smiexlm.device.cpu_has_native_bf16`, when a ``precision="auto"`` run (pre-training,
fine-tuning, their evaluation) picks its autocast; a test that never gets there computes the
same thing under either value, and running it twice proves nothing new.

Every unit test is marked ``precision`` (it runs in both passes) except those of the modules
in :data:`PRECISION_FREE`: modules that never reach a ``precision="auto"`` choice, because
they train nothing and run no autocast (tokenizers, preprocessing, dataset loaders and splits,
metrics, calibration, and the fp32 paths: embedding, serving, ONNX, the linear probe, the
model folders' checks). A new test module is in the second pass until it is listed here.

The listing is checked while those tests run: their ``SMIEXLM_NATIVE_BF16`` is a value that
no reader accepts (a subprocess that reads it fails with a ConfigError naming it), and a read
in this process fails the test at teardown. A module-scoped or session fixture that the listed
module shares with a module run before it is not checked (it was built outside the guard).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import smiexlm.device as device

UNIT = Path(__file__).parent

#: unit test modules (relative to tests/unit) whose tests never read the precision switch
PRECISION_FREE = frozenset(
    {
        "analysis/test_analysis_measures.py",
        "dag/test_dag.py",
        "dag/test_dag_matmul.py",
        "dag/test_dag_triton.py",
        "data/test_data.py",
        "data/test_descriptors.py",
        "data/test_widen.py",
        "featurizer/test_batch_invariance.py",
        "featurizer/test_featurizer.py",
        "featurizer/test_featurizer_integrations.py",
        "featurizer/test_whitening.py",
        "glue/test_glue_metrics.py",
        "glue/test_glue_tasks.py",
        "model/test_model.py",
        "modelio/test_integrity.py",
        "model/test_model_inputs.py",
        "model/test_model_overfit.py",
        "moleculenet/test_moleculenet_data.py",
        "moleculenet/test_moleculenet_metrics.py",
        "forests/test_blend.py",
        "forests/test_kernels.py",
        "moleculenet/test_cliffs.py",
        "finetuning/test_probe.py",
        "parts/test_embed_parts.py",
        "parts/test_search.py",
        "parts/test_ray_writers.py",
        "serving/test_onnx.py",
        "test_moved.py",
        "test_paths.py",
        "test_ranks.py",
        "text/test_text_blocks.py",
        "tokenizer/test_text_tokenizer.py",
        "tokenizer/test_tokenizer.py",
        "trust/test_calibration.py",
        "trust/test_conformal.py",
    }
)
#: what a precision-free test (and any subprocess it starts) sees as the switch's value
UNREAD = "unread-by-precision-free-tests"


def _module(item: pytest.Item) -> str | None:
    """``item``'s module relative to tests/unit, or None outside it."""
    path = Path(item.path)
    return path.relative_to(UNIT).as_posix() if path.is_relative_to(UNIT) else None


def _precision_free(item: pytest.Item) -> bool:
    return _module(item) in PRECISION_FREE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _module(item) is not None and not _precision_free(item):
            item.add_marker(pytest.mark.precision)


_GUARDS: dict[str, tuple[pytest.MonkeyPatch, list[str]]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if _precision_free(item):
        reads: list[str] = []

        def refuse() -> bool:
            reads.append(item.nodeid)
            raise AssertionError(f"{_module(item)} reads the precision switch: remove it from "
                                 "PRECISION_FREE in tests/unit/conftest.py")  # fmt: skip

        patch = pytest.MonkeyPatch()
        patch.setenv(device.NATIVE_BF16_ENV, UNREAD)
        patch.setattr(device, "cpu_has_native_bf16", refuse)
        _GUARDS[item.nodeid] = (patch, reads)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        guard = _GUARDS.pop(item.nodeid, None)
        if guard is not None:
            guard[0].undo()
            if guard[1]:
                pytest.fail(f"{item.nodeid} read SMIEXLM_NATIVE_BF16 but its module is listed "
                            "in PRECISION_FREE (tests/unit/conftest.py)", pytrace=False)  # fmt: skip
