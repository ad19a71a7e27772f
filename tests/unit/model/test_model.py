"""Unit tests of the encoder core: config, expansion, RoPE, transitions, masking, heads, I/O."""

from __future__ import annotations

import json
import math

import pytest
import torch

from smiexlm import ExLMConfig, ExLMModel
from smiexlm.errors import ConfigError, DataError, VocabularyMismatchError
from smiexlm.model.config import PAPER_MOL_VOCAB_SIZE, SHIPPED_VOCAB_SIZE
from smiexlm.model.expansion import expand_states, gather_states
from smiexlm.model.heads import ExLMForSequencePrediction, task_loss
from smiexlm.model.masking import mask_tokens, repeat_tokens
from smiexlm.model.rope import apply_rotary, rope_angles_2d
from smiexlm.model.transitions import TransitionHead, uniform_log_links, valid_successors
from smiexlm.tokenizer import SmilesTokenizer

torch.set_num_threads(1)
SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CN1CCC[C@H]1c1cccnc1", "ClCCl", "C#N"]
IDS = {"pad": 0, "bos": 1, "eos": 2, "mask": 3}


def micro(objective: str = "mlm", vocab_size: int = 40, **kw) -> ExLMConfig:
    base = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 2, "n_transition_heads": 2}
    return ExLMConfig.tiny(objective=objective, vocab_size=vocab_size, **{**base, **kw})


def batch(seed: int = 0):
    tok = SmilesTokenizer.build(SMILES)
    enc = tok.encode_batch(SMILES)
    g = torch.Generator().manual_seed(seed)
    masked, labels = mask_tokens(enc.input_ids, enc.attention_mask, 0.3, generator=g)
    return tok, enc, masked, labels


# ---------------------------------------------------------------------- config
def test_presets_and_validation():
    assert ExLMConfig.mol_base().k == 2 and ExLMConfig.text_base().k == 4
    assert ExLMConfig.text_large().n_layers == 24
    assert ExLMConfig.tiny(n_layers=7).maelm_decoder_layers == 2
    assert ExLMConfig.tiny(n_layers=2).maelm_decoder_layers == 1
    with pytest.raises(ConfigError, match="objective"):
        ExLMConfig.tiny(objective="bert")
    with pytest.raises(ConfigError, match="'k'"):
        ExLMConfig.tiny(k=0)
    with pytest.raises(ConfigError, match="d_model"):
        ExLMConfig.tiny(d_model=130)
    with pytest.raises(ConfigError, match="dag"):
        ExLMConfig.tiny(dag="dense")
    with pytest.raises(ConfigError, match="colour"):
        ExLMConfig.from_dict({**ExLMConfig.tiny().to_dict(), "colour": 1})
    cfg = ExLMConfig.small(objective="exlm", k=4)
    assert ExLMConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_parameter_counts():
    with torch.device("meta"):
        base = ExLMModel(ExLMConfig.mol_base(vocab_size=PAPER_MOL_VOCAB_SIZE))
        tiny = ExLMModel(ExLMConfig.tiny())
        small = ExLMModel(ExLMConfig.small())
    # 9 x 5,513,984 + embedding 369x768 + final LN + RoBERTa LM head (method notes §3).
    expected = 9 * 5_513_984 + 369 * 768 + 2 * 768 + (768 * 768 + 768) + 2 * 768 + 369
    assert expected == 50_503_281
    n = base.num_parameters(include_transitions=False)
    assert abs(n - 50_503_281) <= 0.02 * 50_503_281
    assert n == 50_503_281
    assert base.num_parameters() > n  # the transition head comes on top
    assert 0.7e6 < tiny.num_parameters() < 1.3e6
    assert 8e6 < small.num_parameters() < 12e6


def test_named_presets_build_models_for_the_shipped_vocabulary(tmp_path):
    from smiexlm.tokenizer import SmilesTokenizer

    tokenizer = SmilesTokenizer()
    assert tokenizer.vocab_size == SHIPPED_VOCAB_SIZE
    for name in ("tiny", "small", "mol_base"):
        assert ExLMConfig.preset(name).vocab_size == tokenizer.vocab_size, name
    with torch.device("meta"):
        base = ExLMModel(ExLMConfig.mol_base())
    # the shipped vocabulary has 36 tokens fewer than the paper's: 36 embedding rows + biases
    assert base.num_parameters(include_transitions=False) == 50_503_281 - 36 * 769
    model = ExLMModel(ExLMConfig.tiny())
    model.save_pretrained(tmp_path / "tiny")  # the default tokenizer fits without arguments
    assert ExLMModel.from_pretrained(tmp_path / "tiny").config.vocab_size == SHIPPED_VOCAB_SIZE


# ---------------------------------------------------------------------- expansion
def test_expansion_hand_example():
    # [BOS] C [MASK] O [MASK] [EOS] [PAD]  and  [BOS] [MASK] [EOS] [PAD]...
    ids = torch.tensor([[1, 7, 3, 8, 3, 2, 0], [1, 3, 2, 0, 0, 0, 0]])
    att = ids != 0
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 4], labels[1, 1] = 9, 10, 11
    ex = expand_states(ids, att, 2, **{f"{k}_id": v for k, v in IDS.items()}, labels=labels)
    # expanded length n + (#masks + 2)(k - 1): 6 + 4 = 10 and 3 + 3 = 6
    assert ex.attention_mask.sum(1).tolist() == [10, 6]
    assert ex.input_ids.tolist() == [[1, 1, 7, 3, 3, 8, 3, 3, 2, 2], [1, 1, 3, 3, 2, 2, 0, 0, 0, 0]]
    assert ex.seq_positions[0].tolist() == [0, 0, 1, 2, 2, 3, 4, 4, 5, 5]
    assert ex.clone_positions[0].tolist() == [1, 2, 0, 1, 2, 0, 1, 2, 1, 2]
    assert ex.seq_positions[1, :6].tolist() == [0, 0, 1, 1, 2, 2]
    assert ex.clone_positions[1, :6].tolist() == [1, 2, 1, 2, 1, 2]
    assert ex.state_index.tolist() == [[0, 1, 3, 4, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 0, 0]]
    assert ex.state_mask.tolist() == [[True] * 8, [True] * 6 + [False] * 2]
    assert ex.state_groups[0].tolist() == [0, 0, 2, 2, 4, 4, 5, 5]
    assert ex.state_lengths.tolist() == [8, 6] and ex.target_lengths.tolist() == [4, 3]
    assert ex.targets.tolist() == [[1, 9, 10, 2], [1, 11, 2, 0]]
    hidden = torch.arange(2 * 10, dtype=torch.float32).reshape(2, 10, 1).expand(2, 10, 3)
    compact = gather_states(hidden, ex.state_index)  # (2, 8, 3)
    assert compact[0, :, 0].tolist() == [0, 1, 3, 4, 6, 7, 8, 9]
    assert compact[1, :6, 0].tolist() == [10, 11, 12, 13, 14, 15]
    flat = expand_states(ids, att, 2, **{f"{k}_id": v for k, v in IDS.items()}, rope_2d=False)
    assert int(flat.clone_positions.abs().sum()) == 0
    with pytest.raises(DataError, match="MASK"):
        expand_states(
            ids, att, 2, **{f"{k}_id": v for k, v in IDS.items()}, labels=labels * 0 - 100
        )


def test_rope_2d_depends_only_on_coordinate_differences():
    g = torch.Generator().manual_seed(0)
    d = 16
    q, k = torch.randn(1, 1, 1, d, generator=g), torch.randn(1, 1, 1, d, generator=g)

    def score(pq, pk):
        cq, sq = rope_angles_2d(torch.tensor([[pq[0]]]), torch.tensor([[pq[1]]]), d)
        ck, sk = rope_angles_2d(torch.tensor([[pk[0]]]), torch.tensor([[pk[1]]]), d)
        return float((apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum())

    base = score((5, 1), (2, 3))
    for shift in [(0, 0), (7, 0), (0, 4), (11, 2), (-2, -1)]:
        moved = score((5 + shift[0], 1 + shift[1]), (2 + shift[0], 3 + shift[1]))
        assert moved == pytest.approx(base, abs=1e-4)
    assert abs(score((5, 2), (2, 3)) - base) > 1e-3  # the clone coordinate matters
    assert abs(score((6, 1), (2, 3)) - base) > 1e-3  # the sequence coordinate matters
    # norms are preserved (pure rotation)
    c, s = rope_angles_2d(torch.tensor([[9]]), torch.tensor([[4]]), d)
    assert float(apply_rotary(q, c, s).norm()) == pytest.approx(float(q.norm()), rel=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_rotary_equals_the_pairwise_rotation(dtype, tol):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    cos, sin = rope_angles_2d(torch.arange(5).expand(2, 5), torch.arange(5).expand(2, 5) % 2, 8)
    c, s = cos.double(), sin.double()
    x1, x2 = x[..., 0::2], x[..., 1::2]  # pair p = dimensions (2p, 2p + 1)
    expected = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    got = apply_rotary(x.to(dtype), cos, sin)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)


# ---------------------------------------------------------------------- dropout
def test_cpu_dropout_masks_rate_seed_and_scale():
    from smiexlm.model.dropout import dropout, keep_mask

    torch.manual_seed(5)
    a, b = keep_mask((1000, 1000), 0.1), keep_mask((1000, 1000), 0.1)
    assert a.dtype == torch.bool and a.shape == (1000, 1000)
    assert abs(float(a.float().mean()) - 0.9) < 2e-3  # 1e6 draws: sd 3e-4
    assert not torch.equal(a, b)  # a fresh mask per call
    torch.manual_seed(5)
    assert torch.equal(keep_mask((1000, 1000), 0.1), a)  # torch.manual_seed fixes the masks
    x = torch.rand(64, 64, dtype=torch.float64) + 1.0
    y = dropout(x, 0.25)
    kept = y != 0
    assert 0.6 < float(kept.double().mean()) < 0.9
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0) is x
    x.requires_grad_(True)
    torch.manual_seed(1)
    dropout(x, 0.25).sum().backward()
    torch.manual_seed(1)
    torch.testing.assert_close(x.grad, keep_mask(x.shape, 0.25).double() / 0.75)


def test_attention_with_dropout_is_sdpa_when_nothing_drops():
    import torch.nn.functional as F

    from smiexlm.model.encoder import attention_with_dropout

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) for _ in range(3))
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    torch.testing.assert_close(attention_with_dropout(q, k, v, key_mask, 0.0), expected)
    torch.manual_seed(0)
    dropped = attention_with_dropout(q, k, v, key_mask, 0.5)
    assert dropped.shape == expected.shape and not torch.allclose(dropped, expected)


# ---------------------------------------------------------------------- transitions
@pytest.mark.parametrize("sparse", [False, True])
def test_transition_rows_are_distributions_over_valid_successors(sparse):
    torch.manual_seed(0)
    cfg = micro("exlm", k=3, n_transition_heads=4)
    head = TransitionHead(cfg)
    state_mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    groups = torch.tensor([[0, 0, 0, 4, 4, 4, 7, 7, 7], [0, 0, 0, 2, 2, 2, 0, 0, 0]])
    valid = valid_successors(state_mask, groups, sparse)
    for log_e in (head(torch.randn(2, 9, cfg.d_model), valid), uniform_log_links(valid)):
        probs = log_e.exp()
        has_successor = valid.any(-1)
        row_sums = probs.sum(-1)
        assert torch.allclose(row_sums[has_successor], torch.ones(()), atol=1e-5)
        assert torch.all(row_sums[~has_successor] == 0)
        assert torch.all(torch.isneginf(log_e[~valid]))
        assert torch.all(torch.isfinite(log_e[valid]))
        assert not torch.any(torch.tril(probs[0]) > 0)  # strictly upper-triangular
        assert torch.all(probs[1, 6:] == 0) and torch.all(probs[1, :, 6:] == 0)
    same_group = groups[:, :, None] == groups[:, None, :]
    assert bool((valid & same_group).any()) is (not sparse)
    uni = uniform_log_links(valid).exp()
    assert uni[0, 0, 1 if not sparse else 3] == pytest.approx(1 / (8 if not sparse else 6))


def test_single_head_is_the_paper_formula():
    torch.manual_seed(1)
    cfg = micro("exlm", n_transition_heads=1)
    head = TransitionHead(cfg)
    h = torch.randn(1, 5, cfg.d_model)
    valid = valid_successors(torch.ones(1, 5, dtype=torch.bool), torch.arange(5)[None], False)
    feats = torch.cat([h, head.position(torch.arange(5))[None]], -1)
    scores = head.query(feats) @ head.key(feats).transpose(1, 2) / math.sqrt(cfg.d_model)
    scores = scores.masked_fill(~valid, float("-inf"))
    expected = torch.softmax(scores[:, :4], -1)
    assert torch.allclose(head(h, valid)[:, :4].exp(), expected, atol=1e-6)


# ---------------------------------------------------------------------- masking
def test_masking_policy_statistics():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (400, 50), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2
    att = torch.ones_like(ids, dtype=torch.bool)
    att[:100, 30:] = False
    ids[:100, 30:] = 0
    masked, labels = mask_tokens(ids, att, 0.15, generator=g)
    selected = labels != -100
    assert not selected[:, 0].any() and not selected[:, -1].any() and not selected[~att].any()
    rate = selected.sum() / ((ids >= 5) & att).sum()
    assert abs(float(rate) - 0.15) < 0.01
    assert torch.all(masked[selected] == 3) and torch.equal(masked[~selected], ids[~selected])
    assert torch.equal(labels[selected], ids[selected])
    big = torch.randint(5, 60, (2000, 60), generator=g)
    m2, l2 = mask_tokens(big, big > 0, 0.15, "bert_80_10_10", vocab_size=60, generator=g)
    sel = l2 != -100
    frac_mask = float((m2[sel] == 3).float().mean())
    changed = (m2[sel] != 3) & (m2[sel] != big[sel])
    assert abs(frac_mask - 0.8) < 0.02
    assert abs(float(changed.float().mean()) - 0.1 * 54 / 55) < 0.015
    assert int(m2[sel][m2[sel] != 3].min()) >= 5
    with pytest.raises(ConfigError, match="vocab_size"):
        mask_tokens(big, big > 0, 0.15, "bert_80_10_10")
    with pytest.raises(ConfigError, match="mask_prob"):
        mask_tokens(big, big > 0, 1.5)


def test_repeat_tokens():
    ids = torch.tensor([[1, 7, 8, 2], [1, 9, 2, 0]])
    out, att = repeat_tokens(ids, ids != 0, 3)
    assert out.tolist() == [[1, 7, 7, 7, 8, 8, 8, 2], [1, 9, 9, 9, 2, 0, 0, 0]]
    assert att.sum(1).tolist() == [8, 5]


# ---------------------------------------------------------------------- model behaviour
@pytest.mark.parametrize("objective", ["mlm", "maelm", "exlm"])
def test_padding_invariance(objective):
    torch.manual_seed(0)
    tok, enc, masked, labels = batch()
    model = ExLMModel(micro(objective, vocab_size=tok.vocab_size)).eval()
    pad = torch.zeros(len(SMILES), 5, dtype=torch.long)
    ids2, att2 = torch.cat([masked, pad], 1), torch.cat([enc.attention_mask, pad.bool()], 1)
    lab2 = torch.cat([labels, pad - 100], 1)
    with torch.no_grad():
        a, b = model(masked, enc.attention_mask, labels), model(ids2, att2, lab2)
        assert a.loss.item() == pytest.approx(b.loss.item(), abs=1e-5)
        ea, eb = model.encode(masked, enc.attention_mask), model.encode(ids2, att2)
    real = ea.attention_mask
    assert torch.allclose(
        ea.hidden_states[real], eb.hidden_states[:, : real.shape[1]][real], atol=1e-5
    )


@pytest.mark.parametrize("objective", ["mlm", "maelm", "exlm"])
def test_several_blocks_come_from_one_pass_as_each_block_alone(objective):
    """``encode(layer=(-1, -3))``: each block's states equal those of a model cut after that
    block (the same weights, fewer blocks), side by side in the order asked, each block's
    pooling in turn; ``pooled_only`` gives the same cls; the head reads the last n blocks."""
    torch.manual_seed(0)
    tok, enc, _, _ = batch()
    ids, mask = enc.input_ids, enc.attention_mask
    model = ExLMModel(micro(objective, vocab_size=tok.vocab_size, n_layers=3)).eval()
    cut = ExLMModel(micro(objective, vocab_size=tok.vocab_size, n_layers=1)).eval()
    missing, _ = cut.load_state_dict(model.state_dict(), strict=False)
    assert not missing
    d = model.config.d_model
    with torch.no_grad():
        both = model.encode(ids, mask, "cls+mean", layer=(-1, -3))
        last = model.encode(ids, mask, "cls+mean")
        first = cut.encode(ids, mask, "cls+mean")
        assert both.hidden_states.shape[-1] == 2 * d
        expected = torch.cat([last.pooled, first.pooled], dim=-1)
        torch.testing.assert_close(both.pooled, expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(both.hidden_states[..., d:], first.hidden_states, rtol=0,
                                   atol=1e-6)  # fmt: skip
        quick = model.encode(ids, mask, "cls", layer=(-1, -3), pooled_only=True).pooled
        torch.testing.assert_close(quick, model.encode(ids, mask, "cls", layer=(-1, -3)).pooled,
                                   rtol=0, atol=1e-6)  # fmt: skip
        head = ExLMForSequencePrediction(model, 2, layers=3).eval()
        assert head.head.dense.in_features == 3 * d
        three = model.encode(ids, mask, "cls", layer=(2, 1, 0)).pooled
        torch.testing.assert_close(head.pool(ids, mask), three, rtol=0, atol=1e-6)
    for bad in ((), (-1, 2), (True,), (3,), 1.0):
        with pytest.raises(ConfigError, match="layer"):
            model.encode(ids, mask, layer=bad)  # type: ignore[arg-type]
    for layers in (0, 4, True):
        with pytest.raises(ConfigError, match="layers"):
            ExLMForSequencePrediction(model, 2, layers=layers)


@pytest.mark.parametrize("objective", ["mlm", "maelm", "exlm"])
def test_batch_invariant_encode_gives_a_molecule_bitwise_its_output_alone(objective):
    """Under ``batch_invariant`` (served inference) each molecule's pooled states, and the
    first-position path of a fine-tuned head, are bit for bit those it gets alone, for a
    3-token molecule too (a 3-row matrix product once took another kernel)."""
    from smiexlm.model.encoder import batch_invariant

    torch.manual_seed(0)
    tok = SmilesTokenizer.build(SMILES)
    enc = tok.encode_batch(["C", *SMILES, "C"])
    ids, mask = enc.input_ids, enc.attention_mask
    model = ExLMModel(micro(objective, vocab_size=tok.vocab_size)).eval()
    with torch.inference_mode(), batch_invariant():
        for pooling, first in (("cls+mean+max", False), ("cls", True)):
            whole = model.encode(ids, mask, pooling, pooled_only=first).pooled
            for i in range(len(ids)):
                n = int(mask[i].sum())
                alone = model.encode(ids[i : i + 1, :n], mask[i : i + 1, :n], pooling,
                                     pooled_only=first).pooled  # fmt: skip
                assert torch.equal(alone, whole[i : i + 1]), (objective, pooling, i)
            pair = model.encode(ids[1:3], mask[1:3], pooling, pooled_only=first).pooled
            assert torch.equal(pair, whole[1:3])


def test_exlm_loss_matches_single_path_by_hand():
    # k = 1, uniform transitions: states = targets, so the only path visits every state.
    torch.manual_seed(0)
    tok, enc, masked, labels = batch()
    cfg = micro("exlm", vocab_size=tok.vocab_size, k=1, transitions="uniform")
    model = ExLMModel(cfg).eval()
    with torch.no_grad():
        out = model(masked, enc.attention_mask, labels)
    per_seq = []
    for b in range(len(SMILES)):
        s = int(out.state_lengths[b])
        logp = out.logits[b, :s].log_softmax(-1)
        targets = out.targets[b, :s]
        assert targets[0] == 1 and targets[s - 1] == 2
        assert targets[1 : s - 1].tolist() == labels[b][labels[b] != -100].tolist()
        ll = logp.gather(1, targets[:, None]).sum() - sum(math.log(s - 1 - v) for v in range(s - 1))
        per_seq.append(-ll / s)
    assert out.loss.item() == pytest.approx(float(torch.stack(per_seq).mean()), rel=1e-5)
    assert out.n_invalid == 0


def test_sequence_head_and_task_loss():
    logits = torch.tensor([[0.5, -1.0], [2.0, 0.3]])
    labels = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    present = ~labels.isnan()
    manual = torch.nn.functional.binary_cross_entropy_with_logits(logits[present], labels[present])
    assert task_loss(logits, labels, "multilabel").item() == pytest.approx(manual.item())
    reg = torch.nn.functional.mse_loss(logits[present], labels[present])
    assert task_loss(logits, labels, "regression").item() == pytest.approx(reg.item())
    assert task_loss(logits, torch.full((2, 2), float("nan")), "regression").item() == 0.0
    tok, enc, _, _ = batch()
    model = ExLMModel(micro("exlm", vocab_size=tok.vocab_size, k=3)).eval()
    clf = ExLMForSequencePrediction(model, n_outputs=2, task_type="multilabel").eval()
    out = clf(enc.input_ids, enc.attention_mask, torch.zeros(len(SMILES), 2))
    assert out.logits.shape == (len(SMILES), 2) and out.loss.ndim == 0
    hidden = model.encode(enc.input_ids, enc.attention_mask).hidden_states
    # exlm fine-tuning input: BOS/EOS expanded, cls = the first BOS state
    assert hidden.shape[1] == enc.input_ids.shape[1] + 2 * 2
    # the head's pass computes the last block for the first state only: same values
    assert torch.allclose(out.pooled, hidden[:, 0], atol=1e-5)
    with pytest.raises(ConfigError, match="task_type"):
        ExLMForSequencePrediction(model, 2, task_type="ranking")


def test_the_head_keeps_float32_logits_under_bf16_autocast():
    """Logits a hair apart (a rare-active set's, all near -6) must not tie under bf16
    autocast: a tie reads as chance to ROC-AUC. The head computes in float32 there, as
    without autocast, and a hybrid head's features join unrounded."""
    from smiexlm.model.heads import SequenceHead

    torch.manual_seed(0)
    head = SequenceHead(8, 1, pooler_dropout=0.0).eval()
    with torch.no_grad():
        head.out_proj.bias.fill_(-6.0)
        head.out_proj.weight.mul_(1e-2)
    features = torch.randn(64, 8)
    plain = head(features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = head(features)
        rounded = head._forward(features.bfloat16())  # what plain bf16 would give
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, plain, rtol=0, atol=1e-6)
    assert len(torch.unique(mixed)) > 60 and len(torch.unique(rounded.float())) < 8

    tok, enc, _, _ = batch()
    model = ExLMModel(micro("mlm", vocab_size=tok.vocab_size)).eval()
    hybrid = ExLMForSequencePrediction(model, 1, n_features=3).eval()
    extra = torch.tensor([[1.0 + 2**-12, 0.0, 0.0]] * len(SMILES))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        pooled = hybrid.pool(enc.input_ids, enc.attention_mask)
        a = hybrid(pooled=pooled, features=extra).logits
        b = hybrid(pooled=pooled, features=extra - 2**-12).logits  # one bf16 value apart
    assert a.dtype == torch.float32 and not torch.equal(a, b)


@pytest.mark.parametrize("objective", ["mlm", "exlm", "maelm"])
def test_pooled_only_equals_the_full_pass_and_its_gradients(objective):
    torch.manual_seed(0)
    tok, enc, _, _ = batch()
    # float64: the two passes multiply matrices of different shapes, whose fp32 kernels sum in
    # different orders (gradients then differ by ~1e-5 on AMX CPUs); float64 tests the maths
    model = ExLMModel(micro(objective, vocab_size=tok.vocab_size)).double().eval()
    full = model.encode(enc.input_ids, enc.attention_mask, "cls")
    first = model.encode(enc.input_ids, enc.attention_mask, "cls", pooled_only=True)
    assert first.hidden_states.shape[1] == 1 < full.hidden_states.shape[1]
    assert torch.allclose(first.pooled, full.pooled, atol=1e-10)
    grads = []
    for only in (False, True):
        model.zero_grad()
        model.encode(
            enc.input_ids, enc.attention_mask, "cls", pooled_only=only
        ).pooled.sum().backward()
        grads.append(model.embed.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-10)
    mean = model.encode(enc.input_ids, enc.attention_mask, "mean", pooled_only=True)
    assert torch.allclose(
        mean.pooled, model.encode(enc.input_ids, enc.attention_mask, "mean").pooled, atol=1e-10
    )


# ---------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("objective", ["mlm", "exlm"])
def test_save_load_roundtrip(tmp_path, objective):
    torch.manual_seed(0)
    tok, enc, masked, labels = batch()
    model = ExLMModel(micro(objective, vocab_size=tok.vocab_size)).eval()
    model.save_pretrained(tmp_path / "ckpt", tokenizer=tok)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checksums.json",
        "config.json",
        "model.safetensors",
        "vocab.json",
    ]
    loaded = ExLMModel.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.vocab_hash == tok.vocab_hash
    with torch.no_grad():
        a, b = model(masked, enc.attention_mask, labels), loaded(masked, enc.attention_mask, labels)
        assert torch.equal(a.logits, b.logits) and a.loss.item() == b.loss.item()
        ea = model.encode(enc.input_ids, enc.attention_mask, pooling="mean").pooled
        eb = loaded.encode(enc.input_ids, enc.attention_mask, pooling="mean").pooled
    assert torch.equal(ea, eb)
    model.save_pretrained(tmp_path / "half", tokenizer=tok, dtype=torch.float16)
    half = ExLMModel.from_pretrained(tmp_path / "half")
    with torch.no_grad():
        eh = half.encode(enc.input_ids, enc.attention_mask, pooling="mean").pooled
    assert torch.allclose(eh, ea, atol=2e-2)
    assert (tmp_path / "half" / "model.safetensors").stat().st_size < (
        tmp_path / "ckpt" / "model.safetensors"
    ).stat().st_size


def test_load_rejects_wrong_vocabulary_and_shapes(tmp_path):
    from safetensors.torch import load_file, save_file

    tok, *_ = batch()
    model = ExLMModel(micro("mlm", vocab_size=tok.vocab_size))
    folder = model.save_pretrained(tmp_path / "ckpt", tokenizer=tok)
    other = SmilesTokenizer.build(["CCBr", "c1ccncc1S"])
    with pytest.raises(VocabularyMismatchError, match="vocab_size"):
        model.save_pretrained(tmp_path / "bad", tokenizer=other)
    other.save(folder / "vocab.json")
    with pytest.raises(VocabularyMismatchError, match="tokens"):
        ExLMModel.from_pretrained(folder)
    same_size = SmilesTokenizer(tok.tokens[:5] + list(reversed(tok.tokens[5:])))
    same_size.save(folder / "vocab.json")
    with pytest.raises(VocabularyMismatchError, match="hash"):
        ExLMModel.from_pretrained(folder)
    tok.save(folder / "vocab.json")
    weights = load_file(str(folder / "model.safetensors"))
    weights["lm_head.dense.weight"] = weights["lm_head.dense.weight"][:, :-1].contiguous()
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(DataError, match=r"lm_head\.dense\.weight.*shape"):
        ExLMModel.from_pretrained(folder)
    with pytest.raises(DataError, match="does not exist"):
        ExLMModel.from_pretrained(tmp_path / "nowhere")


def test_a_combined_pooling_puts_each_pooling_side_by_side():
    from smiexlm.model.pooling import pool, pooling_parts

    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    by_hand = {
        "cls": hidden[:, 0],
        "mean": torch.stack([hidden[i, : int(mask[i].sum())].mean(0) for i in range(3)]),
        "max": torch.stack([hidden[i, : int(mask[i].sum())].amax(0) for i in range(3)]),
    }
    for spec in ("cls", "mean", "max", "cls+max", "max+mean+cls"):
        expected = torch.cat([by_hand[p] for p in spec.split("+")], dim=-1)
        torch.testing.assert_close(pool(hidden, mask, spec), expected)
    assert pooling_parts("mean+cls") == ("mean", "cls")
    for bad in ("", "sum", "cls+cls", "cls, max", None):
        with pytest.raises(ConfigError, match="pooling"):
            pooling_parts(bad)
