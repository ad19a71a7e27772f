"""Tokenization, in one place: SMILES and text tokenizers, their special ids and vocabularies.

====================  =====================================================================
module                holds
====================  =====================================================================
``special``           the five special tokens, their ids, ``IGNORE_INDEX``
``smiles``            :class:`SmilesTokenizer` (regex of Schwaller et al. 2018 + vocabulary)
``fast``              the vectorised chunk encoder behind ``SmilesTokenizer.encode_batch``
``vocab``             building a SMILES vocabulary from corpus files (``smiexlm vocab build``)
``text``              :class:`TextTokenizer` (subword vocabularies for the text adapter)
``protocol``          the :class:`Tokenizer` interface both satisfy, :func:`load_tokenizer`,
                      :func:`vocabulary_file_hash` (a file's hash, computed from its tokens)
====================  =====================================================================
"""

from smiexlm.tokenizer.protocol import Tokenizer, load_tokenizer, vocabulary_file_hash
from smiexlm.tokenizer.smiles import (
    DEFAULT_VOCAB_PATH,
    SMILES_REGEX,
    VOCAB_FORMAT,
    BatchEncoding,
    SmilesTokenizer,
    Truncation,
    split_smiles,
    vocabulary_hash,
)
from smiexlm.tokenizer.special import (
    BOS_ID,
    EOS_ID,
    IGNORE_INDEX,
    MASK_ID,
    N_SPECIAL_TOKENS,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
)
from smiexlm.tokenizer.text import TextTokenizer

__all__ = [
    "BOS_ID",
    "DEFAULT_VOCAB_PATH",
    "EOS_ID",
    "IGNORE_INDEX",
    "MASK_ID",
    "N_SPECIAL_TOKENS",
    "PAD_ID",
    "SMILES_REGEX",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "VOCAB_FORMAT",
    "BatchEncoding",
    "SmilesTokenizer",
    "TextTokenizer",
    "Tokenizer",
    "Truncation",
    "load_tokenizer",
    "split_smiles",
    "vocabulary_file_hash",
    "vocabulary_hash",
]
