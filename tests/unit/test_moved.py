"""A module path that moved to another layer still imports for a release, warning once and
giving the very objects of its new home."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from smiexlm.core.moved import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_warns_and_holds_the_new_modules_objects(old, new, monkeypatch):
    homes = (new,) if isinstance(new, str) else new  # a module split in two: both halves
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {' and '.join(homes)}")):
        module = importlib.import_module(old)
    for home in homes:
        target = importlib.import_module(home)
        public = [k for k in vars(target) if not k.startswith("_")]
        assert public and all(getattr(module, k) is getattr(target, k) for k in public)
        assert importlib.util.find_spec(home).origin != importlib.util.find_spec(old).origin


def test_the_public_api_is_where_users_import_it():
    """``from smiexlm import Featurizer`` and the old top-level path give the one class."""
    import warnings

    from smiexlm import Featurizer
    from smiexlm.embedding.featurizer import Featurizer as Home

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from smiexlm.featurizer import Featurizer as Old
    assert Featurizer is Home is Old


def test_a_name_that_never_was_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("smiexlm.moleculenet.no_such_module")
