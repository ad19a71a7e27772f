"""Widening a pretraining corpus toward the chemistry evaluation sets ask about.

Steps, each on its own and composable, streaming one molecule at a time and seeded:
``brics`` (larger molecules from recombined corpus fragments, :mod:`.brics`), ``protonate``
(charged forms at pH 7.4) and ``salts`` (counter-ions, charge-balanced, :mod:`.charges`),
``tautomers`` and ``stereo`` (:mod:`.variants`), ``elements`` (I, Se, Si, B, P by
substitution, :mod:`.elements`). No evaluation molecule gets through (:mod:`.exclusion`).
:mod:`.steps` runs them over a block of molecules; :mod:`.run` over a file, resumably.
"""
