"""The columns ``smiexlm predict`` writes, by name: one list for its writer
(:mod:`smiexlm.serving.prediction`) and for every reader of its output (``select``).

A prediction table holds the input's id columns, then ``smiles`` and ``valid``, then the label
columns, then beside each label the columns of :data:`LABEL_SUFFIXES` and the per-molecule
columns of :data:`MOLECULE_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from smiexlm.trust.domain import DEFAULT_K

DOMAIN_COLUMNS = ("nearest_tanimoto", f"mean_tanimoto_k{DEFAULT_K}", "nearest_cosine",
                  f"mean_cosine_k{DEFAULT_K}", "in_domain")  # fmt: skip
# the calibration a molecule's conformal set rests on (predict --conformal-alpha)
CONFORMAL_COLUMNS = ("outside_calibration", "conformal_bin", "conformal_weight")
MOLECULE_COLUMNS = ("smiles", "valid", "truncated", "untrained_tokens", *DOMAIN_COLUMNS,
                    *CONFORMAL_COLUMNS)  # fmt: skip
# a blend's members that score a class as a probability (the network's sigmoid, a forest's
# share of trees): where a blend serves a quantile score that ranks, these say how unsure
MEMBER_PROBABILITIES = ("_model", "_forest", "_model_rdkit2d", "_rf_rdkit2d", "_rf_both",
                        "_rf_ecfp4")  # fmt: skip
# beside a label: ensemble and random-SMILES spreads, a blend's parts (those members, the
# kernel members and a wide ensemble's spread), conformal sets/intervals and the difficulty
# that scales them
LABEL_SUFFIXES = ("_std", "_tta_std", *MEMBER_PROBABILITIES, "_svr_tanimoto", "_svr_rbf",
                  "_svr_both", "_members_std", "_set", "_low", "_high", "_difficulty")  # fmt: skip


def label_columns(columns: Sequence[str]) -> list[str]:
    """The label columns of a prediction table with these ``columns``: after ``valid`` (the
    input's own columns come before ``smiles``), neither a per-molecule column nor a column
    beside a label (``<label>_std``...)."""
    names = [str(c) for c in columns]
    after = names[names.index("valid") + 1 :] if "valid" in names else names
    present = set(after)
    return [c for c in after if c not in MOLECULE_COLUMNS
            and not any(c.endswith(s) and c[: -len(s)] in present for s in LABEL_SUFFIXES)]  # fmt: skip
