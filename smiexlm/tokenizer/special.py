"""Special tokens and their ids: one contract for every vocabulary smiexlm writes.

====  ========  ==========================================
 id   token     meaning
====  ========  ==========================================
 0    [PAD]     padding (attention mask False)
 1    [BOS]     start of a sequence
 2    [EOS]     end of a sequence
 3    [MASK]    masked token (pretraining)
 4    [UNK]     a well-formed token missing from the vocabulary
====  ========  ==========================================

Ordinary tokens start at id ``N_SPECIAL_TOKENS``. ``IGNORE_INDEX`` marks a label position
that no loss counts (PyTorch's ``ignore_index`` default).
"""

from __future__ import annotations

PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
N_SPECIAL_TOKENS = len(SPECIAL_TOKENS)
IGNORE_INDEX = -100
