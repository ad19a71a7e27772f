"""Continued pre-training: a run that starts from the weights of a model folder (``init``).

The run's ``[model]`` table still says what it trains; the folder must hold a model of that
architecture (every field of its config but the dropouts the same, the dataset's vocabulary, and
the same descriptor columns when it regresses descriptors). Only the weights are taken: the
optimiser, the schedule (warm-up included) and the data position start afresh, as in a new run.
A resumed run restores its own checkpoint instead.
"""

from __future__ import annotations

import dataclasses

from smiexlm.errors import ConfigError

FREE_FIELDS = ("dropout", "attention_dropout")  # a continued run may set its own


def load_initial_weights(model, init: str, descriptor_stats=None) -> None:
    """Copy the weights of the model folder (or shipped model) ``init`` into ``model``;
    ConfigError naming each field in which the two models differ."""
    from smiexlm.modelio.pretrained import load_pretrained

    source = load_pretrained(init).model  # a folder, or a shipped model by name
    mine, theirs = dataclasses.asdict(model.config), dataclasses.asdict(source.config)
    differ = [k for k in mine if k not in FREE_FIELDS and mine[k] != theirs.get(k)]
    if differ:
        fields = "; ".join(f"{k} = {theirs.get(k)!r} there, {mine[k]!r} here" for k in differ)
        raise ConfigError(
            "init", init, f"a model of the run's architecture and vocabulary ({fields})"
        )
    names = getattr(source.descriptor_stats, "names", None)
    if descriptor_stats is not None and names is not None and names != descriptor_stats.names:
        raise ConfigError("init", init, "a model that regresses the dataset's descriptor columns")
    model.load_state_dict(source.state_dict())
