"""``ExLMConfig``: one flat, validated configuration for the encoder and its four objectives.

Named presets are classmethods that pass literals (``ExLMConfig.mol_base()``); any field can be
overridden by keyword (``ExLMConfig.tiny(objective="exlm", k=4)``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError, check_field_types
from smiexlm.paths import read_json_file
from smiexlm.tokenizer.special import BOS_ID, EOS_ID, MASK_ID, N_SPECIAL_TOKENS, PAD_ID

Objective = Literal["mlm", "exlm", "maelm", "mtr"]
PresetName = Literal["tiny", "small", "mol_base", "text_base", "text_large"]
PRESETS: tuple[str, ...] = get_args(PresetName)  # the classmethods of the same names
MaskPolicy = Literal["all_mask", "bert_80_10_10"]

_OBJECTIVES = ("mlm", "exlm", "maelm", "mtr")
_POLICIES = ("all_mask", "bert_80_10_10")
_TRANSITIONS = ("learned", "uniform")
_DAGS = ("full", "sparse")
# Tokens of the shipped SMILES vocabulary (smiexlm/assets/vocab.json; a test checks), so that
# every molecular preset builds a model that saves and loads with the default tokenizer.
SHIPPED_VOCAB_SIZE = 333
# The paper's molecular vocabulary: ExLMConfig.mol_base(vocab_size=PAPER_MOL_VOCAB_SIZE) has
# the paper's 50,503,281 parameters (Table 7).
PAPER_MOL_VOCAB_SIZE = 369
# Longest input a config may declare: the paper uses 512 (512·k in the repeated-MLM analysis);
# far above it, an untrusted config.json would size position tables of terabytes.
MAX_POSITIONS_LIMIT = 65536
MAX_DESCRIPTORS = 100_000  # descriptor targets a config may declare (RDKit 2D has ~210)


@dataclass
class ExLMConfig:
    """Architecture and pre-training objective of an :class:`~smiexlm.ExLMModel`."""

    vocab_size: int = SHIPPED_VOCAB_SIZE
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    d_ff: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    # Longest *unexpanded* input (tokens incl. BOS/EOS). RoPE needs no table; the limit sizes
    # the transition head's state-position table (k * max_positions rows).
    max_positions: int = 512
    objective: Objective = "mlm"
    # ExLM: states per expanded token ([MASK], BOS, EOS). k = 1 keeps one state per [MASK].
    k: int = 2
    rope_2d: bool = True  # False = ablation "w/o 2D RoPE": clones share position (i, 0)
    transitions: Literal["learned", "uniform"] = "learned"  # "uniform" = "w/o Transitions"
    dag: Literal["full", "sparse"] = "full"  # "sparse": no edges between clones of one token
    # Multi-head gated transition head (method notes §2.3); 1 head = the paper's formula.
    n_transition_heads: int = 4
    # MAE-LM decoder depth; None resolves to max(1, n_layers // 3) and is stored resolved.
    maelm_decoder_layers: int | None = None
    mask_prob: float = 0.15
    # ExLM's official run replaces every selected token by [MASK] (no 80/10/10).
    mask_policy: MaskPolicy = "all_mask"
    # Descriptor regression: objective "mtr" alone (no masking), or an auxiliary loss added to
    # mlm/exlm/maelm with aux_descriptor_weight > 0. A head on the pooled state predicts the
    # dataset's normalised descriptors; NaN targets are masked out of the loss.
    n_descriptors: int = 0  # regression targets; 0 = none yet (pretrain sets the dataset's)
    descriptor_pooling: Literal["cls", "mean"] = "cls"
    descriptor_loss: Literal["mse", "huber"] = "mse"  # huber: delta 1 in normalised units
    aux_descriptor_weight: float = 0.0  # mlm/exlm/maelm: weight of the descriptor loss; 0 = off
    # What the auxiliary head sees: "masked" pools the masked pass the LM loss already ran
    # (free); "clean" runs the encoder once more on the unmasked input, as fine-tuning sees it
    # (one more forward and backward). Which one helps more is to be measured.
    aux_descriptor_input: Literal["masked", "clean"] = "masked"
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-5
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    mask_id: int = MASK_ID
    vocab_hash: str | None = None  # sha256 of the token list; checked on load when set

    def __post_init__(self) -> None:
        check_field_types(self)

        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, value, "a positive integer")

        for name in ("vocab_size", "n_layers", "n_heads", "d_model", "d_ff", "max_positions"):
            positive(name)
        if self.max_positions > MAX_POSITIONS_LIMIT:
            raise ConfigError(
                "max_positions", self.max_positions, f"at most {MAX_POSITIONS_LIMIT:,} tokens"
            )
        positive("k")
        positive("n_transition_heads")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(name, value, "a probability in [0, 1)")
        if not isinstance(self.mask_prob, (int, float)) or not 0.0 < self.mask_prob < 1.0:
            raise ConfigError("mask_prob", self.mask_prob, "a probability in (0, 1)")
        if self.objective not in _OBJECTIVES:
            raise ConfigError("objective", self.objective, f"one of {_OBJECTIVES}")
        if self.mask_policy not in _POLICIES:
            raise ConfigError("mask_policy", self.mask_policy, f"one of {_POLICIES}")
        if self.transitions not in _TRANSITIONS:
            raise ConfigError("transitions", self.transitions, f"one of {_TRANSITIONS}")
        if self.dag not in _DAGS:
            raise ConfigError("dag", self.dag, f"one of {_DAGS}")
        self._check_descriptor_fields()
        if not isinstance(self.rope_2d, bool):
            raise ConfigError("rope_2d", self.rope_2d, "True or False")
        if self.d_model % self.n_heads:
            raise ConfigError("d_model", self.d_model, f"a multiple of n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 4:
            # 2D RoPE rotates two halves of each head, each made of (even) rotation pairs.
            raise ConfigError(
                "d_model", self.d_model, "a head dimension (d_model / n_heads) divisible by 4"
            )
        if self.d_model % self.n_transition_heads:
            raise ConfigError(
                "n_transition_heads",
                self.n_transition_heads,
                f"a divisor of d_model={self.d_model}",
            )
        if self.maelm_decoder_layers is None:
            self.maelm_decoder_layers = max(1, self.n_layers // 3)
        positive("maelm_decoder_layers")
        if self.rope_theta <= 0:
            raise ConfigError("rope_theta", self.rope_theta, "a positive number")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        ids["mask_id"] = self.mask_id
        for name, value in ids.items():
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ConfigError(name, value, f"a token id in [0, vocab_size={self.vocab_size})")
        if len(set(ids.values())) != len(ids):
            raise ConfigError("pad_id/bos_id/eos_id/mask_id", ids, "four distinct ids")
        if self.vocab_size <= N_SPECIAL_TOKENS:
            raise ConfigError("vocab_size", self.vocab_size, f"more than {N_SPECIAL_TOKENS}")

    def _check_descriptor_fields(self) -> None:
        n = self.n_descriptors
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_DESCRIPTORS:
            raise ConfigError("n_descriptors", n, f"an integer in [0, {MAX_DESCRIPTORS:,}]")
        choices = {
            "descriptor_pooling": ("cls", "mean"),
            "descriptor_loss": ("mse", "huber"),
            "aux_descriptor_input": ("masked", "clean"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(name, getattr(self, name), f"one of {allowed}")
        w = self.aux_descriptor_weight
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0.0 <= w < float("inf"):
            raise ConfigError("aux_descriptor_weight", w, "a finite number >= 0 (0 = off)")
        if self.objective == "mtr" and w > 0:
            raise ConfigError(
                "aux_descriptor_weight", w, "0 with objective 'mtr' (its loss is the descriptors')"
            )

    @property
    def uses_descriptors(self) -> bool:
        """True when the model has a descriptor head (``mtr``, or an auxiliary weight > 0)."""
        return self.objective == "mtr" or self.aux_descriptor_weight > 0

    def encoder_length(self, n_tokens: int) -> int:
        """Positions the encoder sees for a row of ``n_tokens`` ids (BOS ... EOS): an ExLM
        model expands BOS and EOS into ``k`` states each."""
        return n_tokens + (2 * (self.k - 1) if self.objective == "exlm" else 0)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    # ---------------------------------------------------------------- presets
    @classmethod
    def tiny(cls, **overrides: Any) -> ExLMConfig:
        """About 0.9M parameters: CI, overfit tests, quick experiments."""
        return cls(**{"n_layers": 4, "n_heads": 4, "d_model": 128, "d_ff": 512, **overrides})

    @classmethod
    def small(cls, **overrides: Any) -> ExLMConfig:
        """About 9.8M parameters: laptop-scale pre-training."""
        return cls(**{"n_layers": 6, "n_heads": 6, "d_model": 384, "d_ff": 1280, **overrides})

    @classmethod
    def mol_base(cls, **overrides: Any) -> ExLMConfig:
        """The paper's molecular model (Table 7) over the shipped 333-token vocabulary.

        That is 50,475,597 parameters + the transition head. The paper's count of 50,503,281
        comes with its 369-token vocabulary: ``mol_base(vocab_size=PAPER_MOL_VOCAB_SIZE)``
        (36 more embedding rows and LM-head biases).
        """
        preset = {"n_layers": 9, "n_heads": 12, "d_model": 768, "d_ff": 2048}
        preset.update(objective="exlm", k=2)
        return cls(**{**preset, **overrides})

    @classmethod
    def text_base(cls, **overrides: Any) -> ExLMConfig:
        """Text base model (Table 10): 12 layers, 12 heads, d 768, FFN 3072, k = 4."""
        preset = {"n_layers": 12, "n_heads": 12, "d_model": 768, "d_ff": 3072}
        preset.update(vocab_size=32768, objective="exlm", k=4)
        return cls(**{**preset, **overrides})

    @classmethod
    def text_large(cls, **overrides: Any) -> ExLMConfig:
        """Text large model: 24 layers, 16 heads, d 1024, FFN 4096, k = 4."""
        preset = {"n_layers": 24, "n_heads": 16, "d_model": 1024, "d_ff": 4096}
        preset.update(vocab_size=32768, objective="exlm", k=4)
        return cls(**{**preset, **overrides})

    @classmethod
    def preset(cls, name: PresetName, **overrides: Any) -> ExLMConfig:
        """A preset by name, one of :data:`PRESETS`."""
        if name not in PRESETS:
            raise ConfigError("preset", name, f"one of {PRESETS}")
        return getattr(cls, name)(**overrides)

    # ----------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExLMConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]], f"one of the fields {sorted(known)}")
        return cls(**data)

    def save(self, path: Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ExLMConfig:
        """Read ``config.json``; a file that is not JSON or has bad fields raises an error
        that names it."""
        path, doc = read_json_file(path, "model config")
        try:
            return cls.from_dict(doc)
        except (ConfigError, TypeError) as err:
            raise DataError(f"model config {str(path)!r}: {err}") from None
