"""How far a fine-tuned model's scores can be trusted, from its validation split alone.

:mod:`~smiexlm.trust.calibration`: reliability diagrams, expected calibration error,
temperature scaling and the rank agreement of an uncertainty spread with the error.
:mod:`~smiexlm.trust.conformal`: split-conformal prediction sets (classification) and
intervals (regression), plain or normalised by each molecule's difficulty;
:mod:`~smiexlm.trust.sets`: the sets and intervals, and their coverage, size and width;
:mod:`~smiexlm.trust.shift`: the calibrations that see a shift between the validation and
the predicted molecules (Mondrian by distance, weighted) and the methods ``predict
--conformal-method`` offers; :mod:`~smiexlm.trust.domain`: the applicability domain;
:mod:`~smiexlm.trust.acquisition`: which molecules to label next; :mod:`~smiexlm.trust.reference`:
what a fine-tuned folder keeps of its own data (validation scores, training fingerprints) to
say how far a prediction can be trusted. Arrays are ``(N, T)``:
molecules by tasks, NaN for a missing label (masked per task) or a missing score.
"""
