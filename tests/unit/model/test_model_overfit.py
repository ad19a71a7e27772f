"""Integration: each objective memorises 32 SMILES (fixed masks) on CPU in a few hundred steps."""

from __future__ import annotations

import pytest
import torch

from smiexlm import ExLMConfig, ExLMModel
from smiexlm.model.masking import mask_tokens
from smiexlm.tokenizer import SmilesTokenizer

SMILES = [
    "CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CC(C)Cc1ccc(C(C)C(=O)O)cc1",
    "CN1CCC[C@H]1c1cccnc1", "O=C(O)c1ccccc1OC(C)=O", "CCN(CC)CC", "C1CCCCC1",
    "c1ccc2ccccc2c1", "CC(=O)OCC", "OCC(O)CO", "NC(=O)N", "CC#N", "ClCCl",
    "FC(F)(F)c1ccccc1", "Brc1ccccc1", "CCOC(=O)C", "CSC", "c1ccncc1", "C=CC=C", "CC(C)O",
    "OC(=O)CCC(=O)O", "NCCN", "CCCCCCCC", "c1ccoc1", "c1ccsc1", "CN(C)C=O", "CC(=O)C",
    "O=S(=O)(O)O", "C1CCNCC1", "CCc1ccccc1", "COc1ccccc1",
]  # fmt: skip

# (objective, extra config, steps, loss bound). Initial losses are about 3.1-3.4 nats.
CASES = [
    ("mlm", {}, 150, 0.05),
    ("maelm", {}, 220, 0.3),
    ("exlm", {}, 150, 0.1),
    ("exlm", {"k": 4, "dag": "sparse"}, 150, 0.2),
]


@pytest.mark.parametrize(("objective", "extra", "steps", "bound"), CASES)
def test_objective_memorises_32_smiles(objective, extra, steps, bound):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = SmilesTokenizer.build(SMILES)
    enc = tok.encode_batch(SMILES)
    config = ExLMConfig.tiny(
        objective=objective,
        vocab_size=tok.vocab_size,
        n_layers=2,
        d_model=64,
        d_ff=128,
        n_heads=4,
        n_transition_heads=2,
        dropout=0.0,
        attention_dropout=0.0,
        **extra,
    )
    model = ExLMModel(config)
    g = torch.Generator().manual_seed(0)
    ids, labels = mask_tokens(enc.input_ids, enc.attention_mask, 0.15, generator=g)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(steps):
        out = model(ids, enc.attention_mask, labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        first = out.loss.item() if first is None else first
    model.eval()
    with torch.no_grad():
        final = model(ids, enc.attention_mask, labels)
    assert first > 2.5
    assert final.n_invalid == 0
    assert final.loss.item() < bound, f"{objective} loss {final.loss.item():.3f} >= {bound}"
