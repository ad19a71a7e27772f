"""Heads on top of the encoder: the tied LM head and sequence prediction heads (§2.6).

``ExLMForSequencePrediction`` pools the encoder's states by its ``pooling`` (``cls`` = the
first position, for ExLM the first BOS state; ``mean`` or ``max`` over the real positions),
then ``SequenceHead`` applies dense → tanh → dropout → out_proj. ``task_loss`` is the one
place where missing labels (NaN) are masked out, for ``multilabel`` (a sigmoid and BCE per
label: MoleculeNet's binary and multi-task sets) and ``regression`` (MSE); ``multiclass``
(softmax cross-entropy, GLUE) uses ``IGNORE_INDEX`` (−100) as "missing". A multilabel head may
weigh each task's two classes (``class_weights``, :func:`balanced_class_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from smiexlm.errors import ConfigError
from smiexlm.model.dropout import Dropout
from smiexlm.model.encoder import linear
from smiexlm.model.pooling import last_blocks, pooling_parts
from smiexlm.tokenizer.special import IGNORE_INDEX

# the form of a head: fine-tuning's (dense, tanh, out_proj) or one linear map (a probe's)
HEAD_KINDS = ("mlp", "linear")

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.model.model import ExLMModel

# The loss a head trains with: softmax cross-entropy over classes (GLUE), a sigmoid per label
# (MoleculeNet's binary and multi-label tasks), or regression.
TaskType = Literal["multiclass", "multilabel", "regression"]
_TASK_TYPES = ("multiclass", "multilabel", "regression")


class LMHead(nn.Module):
    """RoBERTa-style LM head: dense → GELU → LayerNorm → projection tied to the embeddings."""

    def __init__(self, d_model: int, vocab_size: int, eps: float = 1e-5):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor, embedding_weight: Tensor) -> Tensor:
        """``hidden`` (..., d), ``embedding_weight`` (V, d) -> logits (..., V)."""
        x = self.norm(F.gelu(self.dense(hidden)))
        return F.linear(x, embedding_weight, self.bias)


def task_loss(
    logits: Tensor,
    labels: Tensor,
    task_type: TaskType,
    regression_loss: Literal["mse", "huber"] = "mse",
    class_weights: Tensor | None = None,
) -> Tensor:
    """Mean loss over the *present* labels.

    ``multiclass``: logits (B, C), labels (B,) long, −100 = missing (softmax cross-entropy).
    ``multilabel``: logits (B, T), labels (B, T) float in {0, 1}, NaN = missing (BCE).
    ``regression``: logits (B, T), labels (B, T) float, NaN = missing (MSE, or Huber with
    delta 1 when ``regression_loss="huber"``).
    ``class_weights`` (2, T), multilabel only: each present entry's loss is weighted by its
    class's weight for its task (row 0 the negatives', row 1 the positives'), and the sum is
    still divided by the number of present labels.
    A batch without any present label gives a zero loss that still carries a gradient graph.
    """
    if task_type == "multiclass":
        present = labels != IGNORE_INDEX
        if not bool(present.any()):
            return logits.sum() * 0.0
        return F.cross_entropy(logits[present], labels[present].long())
    if task_type not in _TASK_TYPES:
        raise ConfigError("task_type", task_type, f"one of {_TASK_TYPES}")
    labels = labels.to(logits.dtype).reshape(logits.shape)
    present = ~torch.isnan(labels)
    if not bool(present.any()):
        return logits.sum() * 0.0
    target = torch.where(present, labels, torch.zeros_like(labels))
    if task_type == "multilabel":
        per_entry = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        if class_weights is not None:
            weights = class_weights.to(per_entry.dtype)
            per_entry = per_entry * torch.where(target > 0.5, weights[1], weights[0])
    elif regression_loss == "huber":
        per_entry = F.huber_loss(logits, target, reduction="none", delta=1.0)
    else:
        per_entry = F.mse_loss(logits, target, reduction="none")
    return (per_entry * present).sum() / present.sum()


def balanced_class_weights(labels: np.ndarray) -> np.ndarray:
    """(2, T) weights of each task's negatives (row 0) and positives (row 1) from training
    labels (N, T) in {0, 1}, NaN = missing: scikit-learn's ``class_weight="balanced"`` per task,
    n / (2 n_class) over the task's present labels, so the weights average 1 over them. A task
    with one class only (or none) keeps weights of 1."""
    labels = np.asarray(labels, dtype=np.float64)
    present = ~np.isnan(labels)
    positives = np.where(present, labels > 0.5, False).sum(axis=0)
    negatives = present.sum(axis=0) - positives
    weights = np.ones((2, labels.shape[1]))
    both = (positives > 0) & (negatives > 0)
    n = (positives + negatives)[both]
    weights[0, both] = n / (2.0 * negatives[both])
    weights[1, both] = n / (2.0 * positives[both])
    return weights


# What a sequence head computes from the pooled features: dense → tanh → dropout → out_proj
# (fine-tuning's), or one linear map (a linear probe's, kept as a model folder; HEAD_KINDS).
HeadKind = Literal["mlp", "linear"]


class SequenceHead(nn.Module):
    """features (B, n_inputs) → dense (to d) → tanh → dropout → out_proj -> (B, n_outputs);
    ``kind="linear"``: out_proj alone, (B, n_inputs) -> (B, n_outputs).

    ``n_inputs`` defaults to ``d_model``; a hybrid head takes d_model + extra features.

    The head computes in its weights' precision even under bf16 autocast: bf16 keeps 8
    significant bits, so logits nearer each other than about 1/256 of their size round to one
    value. On a set of rare actives (MUV: about 0.2 % positive) the fine-tuned logits of a whole
    validation split lie within 0.03 of each other near -6; in bf16 every molecule of a task
    tied, ROC-AUC read 0.5 whatever the model ranked, and selection on it was blind. The head
    is a sliver of the model's work, so nothing measurable is lost.
    """

    def __init__(
        self, d_model: int, n_outputs: int, pooler_dropout: float = 0.1, n_inputs: int | None = None,
        kind: HeadKind = "mlp",
    ):  # fmt: skip
        super().__init__()
        if n_outputs < 1:
            raise ConfigError("n_outputs", n_outputs, "a positive integer")
        if not 0.0 <= pooler_dropout < 1.0:
            raise ConfigError("pooler_dropout", pooler_dropout, "a probability in [0, 1)")
        if kind not in HEAD_KINDS:
            raise ConfigError("head", kind, f"one of {HEAD_KINDS}")
        self.kind = kind
        n_inputs = n_inputs or d_model
        if kind == "mlp":
            self.dense = nn.Linear(n_inputs, d_model)
            self.dropout = Dropout(pooler_dropout)
        self.out_proj = nn.Linear(d_model if kind == "mlp" else n_inputs, n_outputs)

    def forward(self, features: Tensor) -> Tensor:
        device = features.device.type
        if torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                return self._forward(features.to(self.out_proj.weight.dtype))
        return self._forward(features)

    def _forward(self, features: Tensor) -> Tensor:
        # ``linear``: under batch_invariant a batch of 1 to 3 molecules takes a large one's kernel
        if self.kind == "mlp":
            h = torch.tanh(linear(features, self.dense.weight, self.dense.bias))
            features = self.dropout(h)
        return linear(features, self.out_proj.weight, self.out_proj.bias)

    def traced(self, features: Tensor) -> Tensor:
        """The same map in plain torch operations (an exported graph's; eval mode)."""
        if self.kind == "mlp":
            features = torch.tanh(self.dense(features))
        return self.out_proj(features)


@dataclass
class SequencePredictionOutput:
    loss: Tensor | None  # scalar when labels were given
    logits: Tensor  # (B, n_outputs)
    pooled: Tensor  # (B, d) the features the head saw


class ExLMForSequencePrediction(nn.Module):
    """A pre-trained ``ExLMModel`` encoder + a ``SequenceHead`` (multiclass, multilabel,
    regression). For ``multiclass`` n_outputs is the number of classes; otherwise it is the
    number of tasks.

    ``n_features`` > 0 makes a hybrid head: per-molecule features (B, n_features), already
    normalised, are concatenated to the pooled embedding before the head (chemprop's extra
    features). ``pooled`` may be passed instead of ids when the encoder is frozen and its
    features were computed once.

    ``layers`` = n > 1 puts the pooled outputs of the last n blocks (each through the final
    LayerNorm, the last first) side by side before the head, from one pass of the encoder.

    ``class_weights`` (2, T), multilabel only, weighs each task's classes in the loss
    (:func:`task_loss`); they shape training alone and are not saved with the weights.
    ``head="linear"`` makes the head one linear map of the pooled features (a linear probe's).
    """

    def __init__(
        self,
        model: ExLMModel,
        n_outputs: int,
        task_type: TaskType = "multilabel",
        pooler_dropout: float = 0.1,
        pooling: Literal["cls", "mean", "max"] = "cls",
        n_features: int = 0,
        layers: int = 1,
        class_weights: np.ndarray | None = None,
        head: HeadKind = "mlp",
    ):
        super().__init__()
        if task_type not in _TASK_TYPES:
            raise ConfigError("task_type", task_type, f"one of {_TASK_TYPES}")
        if n_features < 0:
            raise ConfigError("n_features", n_features, "0 or a positive integer")
        n_blocks = model.config.n_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= n_blocks:
            raise ConfigError("layers", layers, f"an integer in [1, {n_blocks}] (the encoder's "
                              "blocks)")  # fmt: skip
        self.model = model
        self.task_type = task_type
        self.pooling = pooling
        self.n_features = n_features
        self.layers = layers
        d = model.config.d_model * len(pooling_parts(pooling)) * layers
        self.head = SequenceHead(model.config.d_model, n_outputs, pooler_dropout,
                                 n_inputs=d + n_features, kind=head)  # fmt: skip
        if class_weights is not None:
            class_weights = torch.as_tensor(np.asarray(class_weights), dtype=torch.float32)
            if task_type != "multilabel" or tuple(class_weights.shape) != (2, n_outputs):
                got = (task_type, tuple(class_weights.shape))
                raise ConfigError("class_weights", got, f"(2, {n_outputs}) weights of a "
                                  "multilabel head's negatives and positives")  # fmt: skip
        self.register_buffer("class_weights", class_weights, persistent=False)

    def pool(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T) ids and mask -> (B, layers·d) pooled encoder features."""
        blocks = last_blocks(self.layers)
        return self.model.encode(
            input_ids, attention_mask, pooling=self.pooling, layer=blocks, pooled_only=True
        ).pooled

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        features: Tensor | None = None,
        pooled: Tensor | None = None,
    ) -> SequencePredictionOutput:
        if pooled is None:
            if input_ids is None or attention_mask is None:
                raise ConfigError("input_ids", None, "token ids and a mask, or pooled features")
            pooled = self.pool(input_ids, attention_mask)
        x = pooled
        if self.n_features:
            if features is None or features.shape[-1] != self.n_features:
                got = None if features is None else tuple(features.shape)
                raise ConfigError("features", got, f"(B, {self.n_features}) per-molecule features")
            # the features join at the head's precision, not rounded to a bf16 pooled output's
            dtype = torch.promote_types(pooled.dtype, self.head.out_proj.weight.dtype)
            x = torch.cat([pooled.to(dtype), features.to(dtype)], dim=-1)  # (B, d + F)
        logits = self.head(x)  # (B, n_outputs)
        loss = None
        if labels is not None:
            loss = task_loss(logits, labels, self.task_type, class_weights=self.class_weights)
        return SequencePredictionOutput(loss=loss, logits=logits, pooled=pooled)
