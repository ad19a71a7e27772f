"""One input's DAG, as in ExLM's case study (Figures 10–11, Appendix P).

The chosen tokens of a SMILES are replaced by [MASK]; an ExLM checkpoint expands BOS, each
[MASK] and EOS into k states. Reported per state: its group (BOS / [MASK]@i / EOS), clone
number, the top tokens of its emission distribution; the transition matrix E between states
(exp of the model's log-links, rows = from, columns = to); and the Viterbi path through the
DAG for the true tokens (``smiexlm.dag.dag_best_alignment``), i.e. which state emits which
target on the single best alignment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smiexlm.analysis import inputs
from smiexlm.analysis.plots import plot_dag
from smiexlm.analysis.report import write_rows
from smiexlm.dag import dag_best_alignment, dag_log_likelihood
from smiexlm.errors import ConfigError
from smiexlm.paths import write_json
from smiexlm.tokenizer.special import IGNORE_INDEX


@dataclass
class DagCase:
    smiles: str
    tokens: list[str]  # the SMILES's tokens (no BOS/EOS)
    mask_positions: list[int]  # 0-based indices into ``tokens``
    k: int
    states: list[dict[str, Any]]  # one per state: group, clone, label, top tokens, path target
    transitions: list[list[float]]  # (S, S) probabilities, row = from state
    path: list[int]  # states on the Viterbi path, in order
    path_tokens: list[str]  # the target each path state emits
    log_likelihood: float  # log P(targets) summed over all paths
    files: list[Path] = field(default_factory=list)


def _positions(smiles: str, tokens: list[str], mask_positions: Sequence[int]) -> list[int]:
    """The token indices to mask, sorted; a ConfigError for an empty SMILES, an index named
    twice or one outside the tokens."""
    if not tokens:
        raise ConfigError("--smiles", smiles, "a SMILES of at least one token")
    positions = sorted(int(p) for p in mask_positions)
    if len(set(positions)) < len(positions):
        raise ConfigError("--mask", positions, "token indices each named once")
    if not positions or positions[0] < 0 or positions[-1] >= len(tokens):
        raise ConfigError(
            "--mask", list(mask_positions), f"token indices in [0, {len(tokens) - 1}] ({tokens})"
        )
    return positions


@torch.no_grad()
def dag_case(checkpoint: Path, smiles: str, mask_positions: Sequence[int], top: int = 3) -> DagCase:
    """The DAG of ``smiles`` with the tokens at ``mask_positions`` masked (see module doc)."""
    model, tokenizer = inputs.load_model_and_tokenizer(checkpoint)
    c = model.config
    if c.objective != "exlm":
        raise ConfigError("checkpoint objective", c.objective, "'exlm' (only ExLM has a DAG)")
    tokens = tokenizer.tokenize(smiles)
    positions = _positions(smiles, tokens, mask_positions)
    ids = torch.tensor([tokenizer.encode(smiles)])  # (1, T) BOS ... EOS
    mask = torch.ones_like(ids, dtype=torch.bool)
    columns = torch.tensor(positions) + 1  # +1 for BOS
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, columns] = ids[0, columns]
    masked = ids.clone()
    masked[0, columns] = c.mask_id
    out = model(masked, mask, labels)
    logp = torch.log_softmax(out.logits.double(), -1)  # (1, S, V)
    targets = out.targets  # (1, M) [BOS, masked tokens…, EOS]
    emissions = logp.gather(2, targets[:, None, :].expand(-1, logp.shape[1], -1))  # (1, S, M)
    emissions = emissions.transpose(1, 2)  # (1, M, S)
    links = out.log_links.double()
    align = dag_best_alignment(emissions, links, out.state_lengths, out.target_lengths)[0]
    ll = dag_log_likelihood(emissions, links, out.state_lengths, out.target_lengths)
    s = int(out.state_lengths[0])
    vocab = tokenizer.tokens
    group_names = ["BOS"] + [f"[MASK]@{p}" for p in positions] + ["EOS"]
    probs = logp[0, :s].exp()  # (S, V)
    best_p, best_i = probs.topk(min(top, probs.shape[1]), dim=-1)
    states = []
    for u in range(s):
        g, clone = divmod(u, c.k)
        target = int(align[u])
        states.append(
            {
                "state": u,
                "group": group_names[g],
                "clone": clone + 1,
                "label": f"{group_names[g]}.{clone + 1}",
                "top_tokens": [vocab[int(i)] for i in best_i[u]],
                "top_probs": [round(float(p), 6) for p in best_p[u]],
                "path_target": vocab[int(targets[0, target])] if target >= 0 else None,
            }
        )
    path = [u for u in range(s) if int(align[u]) >= 0]
    return DagCase(
        smiles=smiles,
        tokens=tokens,
        mask_positions=positions,
        k=c.k,
        states=states,
        transitions=links[0, :s, :s].exp().tolist(),
        path=path,
        path_tokens=[states[u]["path_target"] for u in path],
        log_likelihood=float(ll[0]),
    )


def write_dag_case(case: DagCase, out_dir: Path) -> list[Path]:
    """``dag_states.csv``, ``dag.json`` (everything) and ``dag.png`` (heatmap + DAG)."""
    out_dir = Path(out_dir)
    rows = [
        {k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in st.items()}
        for st in case.states
    ]
    doc = {
        "analysis": "dag",
        "smiles": case.smiles,
        "tokens": case.tokens,
        "mask_positions": case.mask_positions,
        "masked_tokens": [case.tokens[p] for p in case.mask_positions],
        "k": case.k,
        "states": case.states,
        "transitions": case.transitions,
        "viterbi_path": case.path,
        "viterbi_tokens": case.path_tokens,
        "log_likelihood": case.log_likelihood,
    }
    case.files = [
        write_rows(rows, out_dir / "dag_states.csv"),
        write_json(doc, out_dir / "dag.json"),
        plot_dag(case, out_dir / "dag.png"),
    ]
    return case.files
