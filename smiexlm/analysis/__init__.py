"""The papers' analyses as library functions (each also a ``smiexlm analyze`` command).

- ``measures``: prediction entropy in bits, τ-effective rank, corrupted-semantics ratio.
- ``repeated_mlm``: ExLM §3's Repeated MLM grid (corrupted semantics vs unreal tokens).
- ``entropy``: prediction entropy of checkpoints at several mask ratios (ExLM App. Q.1).
- ``rank``: effective rank per layer with and without [MASK] (MAE-LM §2.2).
- ``dag_case``: one input's DAG (ExLM Figures 10–11).
"""
