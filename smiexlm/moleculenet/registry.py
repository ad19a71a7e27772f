"""The MoleculeNet datasets smiexlm knows: file, columns, task type, metric and source.

Each entry names the file as it lies under ``SMIEXLM_DATA/moleculenet/`` and the public URL it
can be fetched from when it is not there. ``url`` points at a pinned copy that is
byte-identical to the shared file, so that ``sha256`` can be verified after download;
``deepchem_url`` is DeepChem's own public copy, kept for reference (its row counts differ for
BBBP, ClinTox, ToxCast and MUV, see ``docs/moleculenet.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from smiexlm.errors import ConfigError

TaskType = Literal["classification", "regression"]

_DC = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/"
_CHEMPROP = "https://raw.githubusercontent.com/chemprop/chemprop/3f2b73372a8968f0f73b2fb279a5780cae918d58/data/"
_ATTFP = "https://raw.githubusercontent.com/OpenDrugAI/AttentiveFP/dda6708342ffe255ded73c459ad64214a4615542/data/"
_MAG = "https://raw.githubusercontent.com/golbog/mag/53daf7b6a10540eaa6bc6f0d596946c85681b9ce/data/"

TOX21_TASKS = (
    "NR-AR", "NR-AR-LBD", "NR-AhR", "NR-Aromatase", "NR-ER", "NR-ER-LBD", "NR-PPAR-gamma",
    "SR-ARE", "SR-ATAD5", "SR-HSE", "SR-MMP", "SR-p53",
)  # fmt: skip
MUV_TASKS = (
    "MUV-466", "MUV-548", "MUV-600", "MUV-644", "MUV-652", "MUV-689", "MUV-692", "MUV-712",
    "MUV-713", "MUV-733", "MUV-737", "MUV-810", "MUV-832", "MUV-846", "MUV-852", "MUV-858",
    "MUV-859",
)  # fmt: skip


@dataclass(frozen=True)
class DatasetSpec:
    """One MoleculeNet dataset.

    ``label_cols`` empty means "every column except the SMILES column" (SIDER, ToxCast).
    ``paper_sizes`` are the ExLM paper's Table 9 (train, valid, test) scaffold-split sizes.
    """

    name: str
    filename: str
    smiles_col: str
    label_cols: tuple[str, ...]
    task_type: TaskType
    metric: Literal["roc_auc", "rmse"]
    url: str
    sha256: str | None  # of the file at ``url`` (= the shared copy); None: recorded on first fetch
    deepchem_url: str
    n_rows: int  # data rows in the shared copy
    paper_sizes: tuple[int, int, int] | None = None
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in [
        DatasetSpec(
            "bace", "bace.csv", "mol", ("Class",), "classification", "roc_auc",
            _MAG + "bace.csv",
            "894a1efd23d2c391c6f6ee0fb5f719bf9d6633a6b534ec02472fa11e1d5862a3",
            _DC + "bace.csv", 1513, (1210, 151, 151), "SMILES column is `mol`",
        ),
        DatasetSpec(
            "bbbp", "bbbp.csv", "smiles", ("p_np",), "classification", "roc_auc",
            "https://raw.githubusercontent.com/mcsorkun/Genetic-Selection-Cheminformatics/"
            "6f85cd26ffc0aa00b8c34c6d482a2a5f4de149ae/data/BBBP.csv",
            "21c46d1637ba49d371ec233454a3833bc7123a98f76204841e1674b5767a23a8",
            _DC + "BBBP.csv", 2039, (1631, 204, 204),
        ),
        DatasetSpec(
            "clintox", "clintox.csv", "smiles", ("FDA_APPROVED", "CT_TOX"), "classification",
            "roc_auc", _CHEMPROP + "clintox.csv",
            "cc561402d058a0d996a9f5e5d02bc20f6652b7003525b32c3598b8da4b24e9b7",
            _DC + "clintox.csv.gz", 1478, (1182, 148, 148),
        ),
        DatasetSpec(
            "tox21", "tox21.csv", "smiles", TOX21_TASKS, "classification", "roc_auc",
            _ATTFP + "tox21.csv",
            "7d7e7facd853a63e79ddce4e9c3fcb7a0d83a1c300b603031c0f2c64fbe77761",
            _DC + "tox21.csv.gz", 7831, (6264, 783, 783), "tasks first, then mol_id, smiles",
        ),
        DatasetSpec(
            "toxcast", "toxcast.csv.gz", "smiles", (), "classification", "roc_auc",
            _CHEMPROP + "toxcast.csv.gz",
            "4b9b4366b02ce7ec7a0831d60f8c46f153c53c5e122376df887476240496abd4",
            _DC + "toxcast_data.csv.gz", 8576, (6860, 858, 858), "617 assay columns",
        ),
        DatasetSpec(
            "sider", "sider.csv", "smiles", (), "classification", "roc_auc",
            _CHEMPROP + "sider.csv",
            "71efc6ac4ca82d6545bc512509863281be0f17234afd7adaf71a71899988302e",
            _DC + "sider.csv.gz", 1427, (1141, 143, 143), "27 system-organ classes",
        ),
        DatasetSpec(
            "muv", "muv.csv.gz", "smiles", MUV_TASKS, "classification", "roc_auc",
            _CHEMPROP + "muv.csv.gz",
            "ee68d1fad0b10440dc494ac3a74cf99168a0b0da9683556b2b48220b88172135",
            _DC + "muv.csv.gz", 93087, (74469, 9309, 9309),
        ),
        DatasetSpec(
            "hiv", "hiv.csv.gz", "smiles", ("HIV_active",), "classification", "roc_auc",
            _DC + "HIV.csv", None, _DC + "HIV.csv", 41127,
            notes="the shared copy is gzip-compressed; a download is checked on later uses",
        ),
        DatasetSpec(
            "esol", "esol.csv", "smiles", ("measured log solubility in mols per litre",),
            "regression", "rmse",
            "https://raw.githubusercontent.com/deepchem/deepchem/"
            "108af2176a5f876c2df1df922baadb02d647c826/datasets/delaney-processed.csv",
            "8c06a76f0c6487d29ab0f903e6a7a7139f189ab3c1178f159c8be8964602f189",
            _DC + "delaney-processed.csv", 1128, notes="SMILES with trailing spaces",
        ),
        DatasetSpec(
            "freesolv", "freesolv.csv", "smiles", ("expt",), "regression", "rmse",
            _MAG + "SAMPL.csv",
            "a4fbf3b28fe2e604d6bd7ea0e20b4494ff732400a80f58d1b393677cfbc1b06c",
            _DC + "SAMPL.csv", 642,
        ),
        DatasetSpec(
            "lipophilicity", "lipo.csv", "smiles", ("exp",), "regression", "rmse",
            "https://raw.githubusercontent.com/lvqiujie/Meta-MolNet/"
            "78cd618bcc55e488f4a401a410782b94f9097fda/data/raw/Lipophilicity.csv",
            "3d2a409dc8bdf620876bb7257faf4996df29a19dd0244d0b4a6a8064c306cded",
            _DC + "Lipophilicity.csv", 4200,
        ),
    ]
}  # fmt: skip

ALIASES = {"lipo": "lipophilicity", "delaney": "esol", "sampl": "freesolv"}

# The paper's seven classification sets, in the column order of its Table 1.
PAPER_TASKS = ("bace", "bbbp", "tox21", "sider", "muv", "clintox", "toxcast")

# ExLM paper, Table 1 (test ROC-AUC x 100, scaffold split, mean of 3 seeds).
PAPER_RESULTS: dict[str, dict[str, float]] = {
    "SMILES-BERT (paper)": dict(
        bace=77.8, bbbp=68.6, tox21=75.1, sider=61.2, muv=75.1, clintox=89.8, toxcast=64.9
    ),
    "ExLM (paper)": dict(
        bace=79.6, bbbp=72.8, tox21=78.2, sider=64.5, muv=78.8, clintox=91.6, toxcast=66.9
    ),
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name`` (case-insensitive; ``lipo``/``delaney``/``sampl`` too)."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DATASETS:
        raise ConfigError("dataset", name, f"one of {', '.join(DATASETS)}")
    return DATASETS[key]
