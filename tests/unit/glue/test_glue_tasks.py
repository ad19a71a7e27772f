"""GLUE loaders: row counts of the shared files, quirks, and malformed-line reporting."""

from __future__ import annotations

import pytest

from smiexlm.errors import ConfigError, DataError
from smiexlm.glue import TASKS, get_task, load_task

# Data rows per file, from the shared data README (§3).
KNOWN_ROWS = {
    ("CoLA", "train"): 8551,
    ("CoLA", "dev"): 1043,
    ("CoLA", "test"): 1063,
    ("SST-2", "train"): 67349,
    ("SST-2", "dev"): 872,
    ("SST-2", "test"): 1821,
    ("MRPC", "train"): 3668,
    ("MRPC", "dev"): 408,
    ("MRPC", "test"): 1725,
    ("STS-B", "train"): 5749,
    ("STS-B", "dev"): 1500,
    ("STS-B", "test"): 1379,
    ("RTE", "train"): 2490,
    ("RTE", "dev"): 277,
    ("RTE", "test"): 3000,
    ("WNLI", "train"): 635,
    ("WNLI", "dev"): 71,
    ("WNLI", "test"): 146,
    ("QNLI", "dev"): 5463,
    ("QNLI", "test"): 5463,
}


@pytest.mark.parametrize(("task", "split"), sorted(KNOWN_ROWS))
def test_row_counts_match_shared_files(data_file, task, split):
    path = data_file(f"glue/{task}/{split}.tsv")
    data = load_task(task, split, root=path.parent.parent)
    assert len(data) == KNOWN_ROWS[(task, split)]
    assert len(data.line_numbers) == len(data) and not data.skipped_lines
    t = get_task(task)
    assert (data.text_b is not None) == (t.text_b is not None)
    if split == "test":
        assert data.labels is None
    else:
        assert len(data.labels) == len(data)
        if t.is_regression:
            assert all(0.0 <= y <= 5.0 for y in data.labels)
        else:
            assert set(data.labels) == set(range(t.num_labels))


def test_quirks_bom_headerless_and_quotes(data_file):
    root = data_file("glue/MRPC/train.tsv").parent.parent
    mrpc = load_task("mrpc", "train", root=root)  # BOM before the header's first column
    assert mrpc.text_a[0].startswith("Amrozi accused his brother")
    assert '" the witness "' in mrpc.text_a[0]  # bare quotes kept (no CSV quoting)
    cola = load_task("CoLA", "dev", root=root)  # no header, no final newline
    assert cola.line_numbers[0] == 1 and cola.line_numbers[-1] == 1043
    assert cola.text_a[0] == "The sailors rode the breeze clear of the rocks."
    rte = load_task("RTE", "dev", root=root)
    assert rte.line_numbers[0] == 2  # line 1 is the header
    assert get_task("RTE").labels[rte.labels[0]] == "not_entailment"


def test_missing_file_names_it(tmp_path):
    with pytest.raises(DataError, match=r"QQP/train\.tsv"):
        load_task("QQP", "train", root=tmp_path)
    with pytest.raises(DataError, match=r"MNLI/dev_mismatched\.tsv"):
        load_task("MNLI", "dev_mismatched", root=tmp_path)


def test_unknown_task_and_split():
    with pytest.raises(ConfigError, match="task"):
        get_task("SQuAD")
    with pytest.raises(ConfigError, match="split"):
        load_task("RTE", "validation")
    assert len(TASKS) == 9


def _write(tmp_path, task, name, text):
    folder = tmp_path / task
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return tmp_path


BAD_RTE = (
    "index\tsentence1\tsentence2\tlabel\n"
    "0\tA man sleeps.\tSomeone sleeps.\tentailment\n"
    "1\tonly two fields\tnot_entailment\n"  # line 3: a missing tab
    '2\tHe said "hi.\tHe spoke.\tentailment\n'
    "3\tA cat.\tA dog.\tmaybe\n"  # line 5: a label outside the set
    "4\tLast line.\tNo newline.\tnot_entailment"
)


def test_malformed_lines_are_reported_with_line_numbers(tmp_path):
    root = _write(tmp_path, "RTE", "train.tsv", BAD_RTE)
    with pytest.raises(DataError) as info:
        load_task("RTE", "train", root=root)
    message = str(info.value)
    assert "2 malformed line(s)" in message
    assert "line 3: 3 fields, expected 4" in message
    assert "line 5: label 'maybe'" in message


def test_skip_mode_warns_and_keeps_the_line_numbers(tmp_path):
    root = _write(tmp_path, "RTE", "train.tsv", BAD_RTE)
    with pytest.warns(UserWarning, match="line 3"):
        data = load_task("RTE", "train", root=root, errors="skip")
    assert len(data) == 3 and data.skipped_lines == [3, 5]
    assert data.line_numbers == [2, 4, 6]
    assert data.text_a[1] == 'He said "hi.'
    assert data.labels == [0, 0, 1]


def test_bad_sts_score_and_bom_header(tmp_path):
    header = "\ufeffindex\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    rows = "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t4.2\n1\tg\tf\ty\t1\tn\tn\tC.\tD.\tfive\n"
    root = _write(tmp_path, "STS-B", "dev.tsv", header + rows)
    with pytest.raises(DataError, match=r"line 3: score 'five'"):
        load_task("STS-B", "dev", root=root)


def test_sts_scores_off_the_scale_and_bytes_that_are_not_utf8_are_named_by_line(tmp_path):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    rows = "".join(f"{i}\tg\tf\ty\t{i}\tn\tn\tA.\tB.\t{s}\n"
                   for i, s in enumerate(["4.2", "nan", "inf", "-7", "5.0"]))  # fmt: skip
    root = _write(tmp_path, "STS-B", "dev.tsv", header + rows)
    with pytest.raises(DataError) as info:  # a NaN score used to surface as a diverged loss
        load_task("STS-B", "dev", root=root)
    assert "3 malformed line(s)" in str(info.value)
    for line, raw in ((3, "nan"), (4, "inf"), (5, "-7")):
        assert f"line {line}: score '{raw}' is outside STS-B's scale [0, 5]" in str(info.value)
    path = tmp_path / "RTE" / "train.tsv"
    _write(tmp_path, "RTE", "train.tsv", BAD_RTE.split("\n", 1)[0] + "\n0\tA.\tB.\tentailment\n")
    path.write_bytes(path.read_bytes() + b"1\t\xff\xfe bad\tB.\tentailment\n")
    with pytest.raises(DataError, match=r"train.tsv' line 3: byte 0xff is not UTF-8"):
        load_task("RTE", "train", root=tmp_path)
