"""``ExLMModel``: one pre-norm Transformer encoder with four pre-training objectives.

- ``mlm``: cross-entropy at the masked positions (only those rows reach the LM head).
- ``exlm``: [MASK]/BOS/EOS expanded into k states with 2D RoPE; the states are gathered into a
  compact tensor, which alone goes through the tied LM head (emissions) and the transition head
  (DAG edges); the loss is the DAG alignment loss with targets [BOS, masked tokens…, EOS].
- ``maelm``: the encoder sees the real tokens only (RoPE keeps their original positions); a
  shallow decoder sees the encoder output plus [MASK] embeddings at the masked positions.
- ``mtr``: multi-task regression, no masking: a head on the pooled encoder state predicts the
  dataset's normalised descriptors (masked MSE or Huber; NaN targets are left out). With
  ``aux_descriptor_weight`` > 0 the same head and loss are added to mlm, exlm or maelm.

``encode`` is the fine-tuning/embedding path: the encoder alone, on inputs of the same form
as in pre-training (for exlm, BOS and EOS are still expanded into k states).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from smiexlm.core import hooks
from smiexlm.dag import dag_logits_log_likelihood, dag_loss
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.config import ExLMConfig
from smiexlm.model.dropout import Dropout
from smiexlm.model.encoder import Encoder, count_parameters, init_weights
from smiexlm.model.expansion import (
    ExpandedBatch,
    compact_positions,
    expand_states,
    gather_states,
)
from smiexlm.model.heads import LMHead, SequenceHead, task_loss
from smiexlm.model.pooling import Pooling, block_indices, pool
from smiexlm.model.rope import rope_angles, rope_angles_2d
from smiexlm.model.transitions import TransitionHead, uniform_log_links, valid_successors
from smiexlm.tokenizer.special import IGNORE_INDEX

logger = logging.getLogger(__name__)


@dataclass
class PretrainOutput:
    """Result of ``ExLMModel.forward``. ``logits``: mlm/maelm — (N, V) at the N labelled
    positions (row-major order) when labels are given, else (B, T, V); exlm — (B, S, V) over
    the compact expanded states; mtr — (B, D) normalised descriptor predictions. With a
    descriptor auxiliary, ``loss`` is ``lm_loss + aux_descriptor_weight * desc_loss``."""

    loss: Tensor | None
    logits: Tensor
    n_predictions: int  # masked tokens scored (exlm: target tokens incl. BOS/EOS)
    n_invalid: int = 0  # exlm: sequences without any DAG path (left out of the loss)
    log_links: Tensor | None = None  # exlm: (B, S, S) log transition probabilities
    state_lengths: Tensor | None = None  # exlm: (B,)
    target_lengths: Tensor | None = None  # exlm: (B,)
    targets: Tensor | None = None  # exlm: (B, M) [BOS, masked tokens…, EOS]
    lm_loss: Tensor | None = None  # with a descriptor auxiliary: the LM part of loss
    desc_loss: Tensor | None = None  # descriptor loss (mtr: the loss itself)
    n_descriptor_targets: int = 0  # present (non-NaN) descriptor targets scored
    descriptor_predictions: Tensor | None = None  # (B, D) fp32, normalised units


@dataclass
class EncoderOutput:
    hidden_states: Tensor  # (B, T', d); T' = expanded length for exlm
    pooled: Tensor  # (B, d)
    attention_mask: Tensor  # (B, T') bool, True = real position of hidden_states


class ExLMModel(nn.Module):
    def __init__(self, config: ExLMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.dropout = Dropout(config.dropout)
        self.encoder = Encoder(config, config.n_layers)
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.lm_head = (
            None
            if config.objective == "mtr"
            else LMHead(config.d_model, config.vocab_size, config.layer_norm_eps)
        )
        self.decoder = self.decoder_norm = self.transitions = None
        if config.objective == "maelm":
            self.decoder = Encoder(config, config.maelm_decoder_layers)
            self.decoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if config.objective == "exlm" and config.transitions == "learned":
            self.transitions = TransitionHead(config)
        self.descriptor_head = None
        if config.uses_descriptors:
            if config.n_descriptors < 1:
                raise ConfigError(
                    "n_descriptors", config.n_descriptors, "a positive number of descriptor "
                    "targets for objective 'mtr' or aux_descriptor_weight > 0",
                )  # fmt: skip
            self.descriptor_head = SequenceHead(
                config.d_model, config.n_descriptors, config.dropout
            )
        self.descriptor_stats = None  # DescriptorStats, saved beside the weights
        init_weights(self)

    # ------------------------------------------------------------------ helpers
    def num_parameters(self, include_transitions: bool = True) -> int:
        total = count_parameters(self)
        if not include_transitions and self.transitions is not None:
            total -= count_parameters(self.transitions)
        return total

    def _check_inputs(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise DataError(
                f"input_ids {tuple(input_ids.shape)} and attention_mask "
                f"{tuple(attention_mask.shape)}: expected two (B, T) tensors of the same shape"
            )
        if input_ids.shape[1] > self.config.max_positions:
            raise ConfigError(
                "max_positions", self.config.max_positions, f">= input length {input_ids.shape[1]}"
            )
        return attention_mask.bool()

    def _rotary_1d(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope_angles(positions, self.config.head_dim, self.config.rope_theta)

    def _run_encoder(
        self,
        ids: Tensor,
        mask: Tensor,
        rotary: tuple[Tensor, Tensor],
        blocks: Sequence[int] | None = None,
        last_queries: int | None = None,
    ) -> Tensor:
        """Final-normed states (B, L, d) of the last block, or of each of ``blocks`` (0-based)
        side by side, (B, L, n·d); ``last_queries`` cuts them all to the first n positions."""
        x = self.dropout(self.embed(ids))  # (B, L, d)
        blocks = (self.config.n_layers - 1,) if blocks is None else blocks
        states = self.encoder.outputs(x, rotary, mask, blocks, last_queries)
        if len(states) == 1:
            return self.final_norm(states[0])
        n = min(h.shape[1] for h in states)
        return torch.cat([self.final_norm(h[:, :n]) for h in states], dim=-1)

    def _expand(self, input_ids: Tensor, mask: Tensor, labels: Tensor | None) -> ExpandedBatch:
        c = self.config
        return expand_states(
            input_ids,
            mask,
            c.k,
            mask_id=c.mask_id,
            bos_id=c.bos_id,
            eos_id=c.eos_id,
            pad_id=c.pad_id,
            rope_2d=c.rope_2d,
            labels=labels,
        )

    def _encode_expanded(
        self, ex: ExpandedBatch, blocks: Sequence[int] | None = None,
        last_queries: int | None = None,
    ) -> Tensor:  # fmt: skip
        rotary = rope_angles_2d(
            ex.seq_positions, ex.clone_positions, self.config.head_dim, self.config.rope_theta
        )
        return self._run_encoder(ex.input_ids, ex.attention_mask, rotary, blocks, last_queries)

    def _encode_real_tokens(
        self, input_ids: Tensor, mask: Tensor, blocks: Sequence[int] | None = None,
        last_queries: int | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """MAE-LM encoder: [MASK] positions removed, original positions kept via RoPE.
        Returns hidden (B, Te, d), the original column of each row (B, Te), its mask."""
        index, valid = compact_positions(mask & (input_ids != self.config.mask_id))
        ids = input_ids.gather(1, index).masked_fill(~valid, self.config.pad_id)
        hidden = self._run_encoder(ids, valid, self._rotary_1d(index), blocks, last_queries)
        return hidden, index, valid

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        labels: Tensor | None = None,
        descriptors: Tensor | None = None,
    ) -> PretrainOutput:
        """``input_ids`` (B, T) already masked, ``attention_mask`` (B, T) (True = real token),
        ``labels`` (B, T) original ids at masked positions and −100 elsewhere, ``descriptors``
        (B, D) normalised descriptor targets, NaN = missing (mtr, or the auxiliary loss)."""
        mask = self._check_inputs(input_ids, attention_mask)
        if labels is not None and labels.shape != input_ids.shape:
            raise DataError(f"labels {tuple(labels.shape)}: expected {tuple(input_ids.shape)}")
        objective = self.config.objective
        if objective == "mtr":
            return self._forward_mtr(input_ids, mask, descriptors)
        if objective == "exlm":
            out, enc, enc_mask = self._forward_exlm(input_ids, mask, labels)
        else:
            if objective == "maelm":
                hidden, enc, enc_mask = self._forward_maelm_decoder(input_ids, mask)
            else:
                positions = torch.arange(input_ids.shape[1], device=input_ids.device)
                rotary = self._rotary_1d(positions.expand_as(input_ids))
                hidden = enc = self._run_encoder(input_ids, mask, rotary)
                enc_mask = mask
            out = self._lm_output(hidden, mask, labels)
        if self.descriptor_head is None or descriptors is None or out.loss is None:
            return out
        if self.config.aux_descriptor_input == "clean":  # one more pass, on the real tokens
            assert labels is not None  # out.loss is set (internal invariant)
            pooled = self._pooled(torch.where(labels != IGNORE_INDEX, labels, input_ids), mask)
        else:  # the encoder states of the masked pass the LM loss ran
            pooled = pool(enc, enc_mask, self.config.descriptor_pooling)
        pred, desc_loss, n = self._descriptor_loss(pooled, descriptors)
        out.lm_loss, out.desc_loss, out.n_descriptor_targets = out.loss, desc_loss, n
        out.loss = out.loss + self.config.aux_descriptor_weight * desc_loss
        out.descriptor_predictions = pred
        return out

    def _lm_output(self, hidden: Tensor, mask: Tensor, labels: Tensor | None) -> PretrainOutput:
        """mlm/maelm: LM-head logits (and cross-entropy at the labelled positions)."""
        assert self.lm_head is not None  # every objective but mtr has one (internal invariant)
        if labels is None:
            return PretrainOutput(None, self.lm_head(hidden, self.embed.weight), 0)
        selected = (labels != IGNORE_INDEX) & mask  # (B, T)
        logits = self.lm_head(hidden[selected], self.embed.weight)  # (N, V)
        n = logits.shape[0]
        loss = F.cross_entropy(logits.float(), labels[selected]) if n else logits.sum() * 0.0
        return PretrainOutput(loss, logits, n)

    def _forward_maelm_decoder(
        self, input_ids: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder states (B, T, d); the encoder's states (B, Te, d) and their mask (B, Te)."""
        hidden, index, valid = self._encode_real_tokens(input_ids, mask)  # (B, Te, d)
        b, t = input_ids.shape
        mask_vec = self.embed.weight[self.config.mask_id].to(hidden.dtype)
        x = mask_vec.expand(b, t + 1, -1).clone()  # (B, T+1, d); column T absorbs padding
        dest = index.masked_fill(~valid, t)
        x = x.scatter(1, dest[..., None].expand_as(hidden), hidden)[:, :t]  # (B, T, d)
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        x = self.decoder(self.dropout(x), self._rotary_1d(positions), mask)
        return self.decoder_norm(x), hidden, valid  # (B, T, d)

    def _forward_exlm(
        self, input_ids: Tensor, mask: Tensor, labels: Tensor | None
    ) -> tuple[PretrainOutput, Tensor, Tensor]:
        """The output; the expanded states (B, Lx, d) and their mask (B, Lx)."""
        ex = self._expand(input_ids, mask, labels)
        hidden = self._encode_expanded(ex)  # (B, Lx, d)
        states = gather_states(hidden, ex.state_index)  # (B, S, d) compact
        logits = self.lm_head(states, self.embed.weight)  # (B, S, V)
        valid = valid_successors(ex.state_mask, ex.state_groups, self.config.dag == "sparse")
        if self.transitions is None:
            log_links = uniform_log_links(valid)
        else:
            log_links = self.transitions(states, valid)  # (B, S, S)
        out = PretrainOutput(
            None,
            logits,
            int(ex.target_lengths.sum()),
            log_links=log_links,
            state_lengths=ex.state_lengths,
            target_lengths=ex.target_lengths,
            targets=ex.targets,
        )
        if labels is None:
            return out, hidden, ex.attention_mask
        rows = ex.target_lengths > 0  # sequences with something to align
        if not bool(rows.any()):  # a zero that still reaches every parameter, as DDP expects
            links = log_links.masked_fill(~torch.isfinite(log_links), 0.0)
            out.loss = (logits.sum() + links.sum()) * 0.0
            return out, hidden, ex.attention_mask
        if not bool(rows.all()):
            logits, log_links = logits[rows], log_links[rows]
        ll = dag_logits_log_likelihood(
            logits.float(),
            ex.targets[rows],
            log_links,
            ex.state_lengths[rows],
            ex.target_lengths[rows],
        )  # (B',)
        out.loss, out.n_invalid = dag_loss(ll, ex.target_lengths[rows])
        if out.n_invalid:
            logger.warning("ExLM: %d of %d sequences have no DAG path", out.n_invalid, len(ll))
        return out, hidden, ex.attention_mask

    # ------------------------------------------------------------------ descriptors
    def _pooled(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        """(B, d): the encoder on (B, T) ids, pooled as the descriptor head expects."""
        pooling = self.config.descriptor_pooling
        return self.encode(input_ids, mask, pooling=pooling, pooled_only=True).pooled

    def _descriptor_loss(self, pooled: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, int]:
        """(B, D) fp32 predictions, the masked loss over the non-NaN targets, their count."""
        assert self.descriptor_head is not None  # internal invariant
        pred = self.descriptor_head(pooled).float()  # (B, D) normalised
        if targets.shape != pred.shape:
            raise DataError(f"descriptors {tuple(targets.shape)}: expected {tuple(pred.shape)}")
        loss = task_loss(pred, targets, "regression", self.config.descriptor_loss)
        return pred, loss, int((~torch.isnan(targets)).sum())

    def _forward_mtr(self, input_ids: Tensor, mask: Tensor, targets: Tensor | None):
        pooled = self._pooled(input_ids, mask)
        if targets is None:
            pred = self.descriptor_head(pooled).float()  # type: ignore[misc]
            return PretrainOutput(None, pred, 0, descriptor_predictions=pred)
        pred, loss, n = self._descriptor_loss(pooled, targets)
        return PretrainOutput(
            loss, pred, n, desc_loss=loss, n_descriptor_targets=n, descriptor_predictions=pred
        )

    @torch.no_grad()
    def predict_descriptors(
        self, input_ids: Tensor, attention_mask: Tensor, denormalize: bool = True
    ) -> Tensor:
        """(B, D) descriptors predicted from (B, T) token ids, in descriptor units (turned back
        with ``descriptor_stats``, the training set's statistics), or normalised with
        ``denormalize=False``. Needs a model with a descriptor head."""
        if self.descriptor_head is None:
            raise ConfigError(
                "objective", self.config.objective,
                "'mtr', or aux_descriptor_weight > 0 (a model with a descriptor head)",
            )  # fmt: skip
        z = self.descriptor_head(self._pooled(input_ids, attention_mask)).float()  # (B, D)
        if not denormalize:
            return z
        if self.descriptor_stats is None:
            raise DataError(
                "the model has no descriptor statistics (descriptors.json beside its weights): "
                "only normalised predictions are available (denormalize=False)"
            )
        return self.descriptor_stats.denormalize(z)

    # ------------------------------------------------------------------ encode
    @torch.no_grad()
    def embed_batch(self, input_ids: Tensor, attention_mask: Tensor, pooling: Pooling = "cls"):
        """Pooled embeddings (B, d) without gradients (inference convenience)."""
        return self.encode(input_ids, attention_mask, pooling=pooling).pooled

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        pooling: str = "cls",
        layer: int | Sequence[int] = -1,
        pooled_only: bool = False,
    ) -> EncoderOutput:
        """Encoder features for fine-tuning and embedding.

        ``layer`` picks the block whose output is returned (0-based, −1 = last), always passed
        through the final LayerNorm; several different ones, such as ``(-1, -2, -3)``, come
        from one pass, side by side in that order (``hidden_states`` (B, T', n·d), ``pooled``
        each block's pooling in turn). ``cls`` pools the first position (for exlm the first
        BOS state); ``mean``/``max`` pool over the real positions of ``hidden_states``; several
        joined by ``+`` (``cls+max``) are put side by side, (B, n·d).
        ``pooled_only`` with ``cls`` computes the deepest block for the first position only
        (same ``pooled``; ``hidden_states`` is then (B, 1, ·)).
        """
        mask = self._check_inputs(input_ids, attention_mask)
        blocks = block_indices(layer, self.config.n_layers)
        first = 1 if pooled_only and pooling == "cls" else None
        if self.config.objective == "exlm":
            ex = self._expand(input_ids, mask, None)
            hidden, out_mask = self._encode_expanded(ex, blocks, first), ex.attention_mask
        elif self.config.objective == "maelm":
            hidden, _, out_mask = self._encode_real_tokens(input_ids, mask, blocks, first)
        else:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
            rotary = self._rotary_1d(positions.expand_as(input_ids))
            hidden, out_mask = self._run_encoder(input_ids, mask, rotary, blocks, first), mask
        out_mask = out_mask[:, : hidden.shape[1]]
        parts = hidden.split(self.config.d_model, dim=-1)
        pooled = torch.cat([pool(h, out_mask, pooling) for h in parts], dim=-1)
        return EncoderOutput(hidden, pooled, out_mask)

    # model folders: smiexlm.modelio, a layer above, answers through smiexlm.core.hooks
    def save_pretrained(
        self, directory: Path | str, tokenizer: Any = None, dtype: torch.dtype | None = None
    ) -> Path:
        """Write ``config.json``, ``vocab.json`` and ``model.safetensors`` into ``directory``."""
        save = hooks.provider("save_model_folder")
        return save(self, Path(directory), tokenizer=tokenizer, dtype=dtype)

    @classmethod
    def from_pretrained(
        cls, directory: Path | str, map_location: str | torch.device = "cpu"
    ) -> ExLMModel:
        """The model of a folder written by ``save_pretrained``, every file checked
        (vocabulary, config sizes, shapes, sha256, finite weights): the weights alone. With
        its tokenizer, normalisation and embedding settings, a folder (or a shipped model by
        name) loads with :func:`smiexlm.modelio.pretrained.load_pretrained`, which calls this."""
        return hooks.provider("load_model_folder")(cls, Path(directory), map_location=map_location)
