"""How far a fine-tuned model's scores can be trusted, from its validation split alone.

:mod:`~smiexlm.trust.calibration`: reliability diagrams, expected calibration error,
temperature scaling and the rank agreement of an uncertainty spread with the error.
:mod:`~smiexlm.trust.conformal`: split-conformal prediction sets (classification) and
intervals (regression) with their measured coverage. Arrays are ``(N, T)``: molecules by
tasks, NaN for a missing label (masked per task) or a missing score.
"""
