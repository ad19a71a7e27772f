"""The shared ground every layer stands on, with the top-level ``errors``, ``paths``,
``atomic``, ``settings`` and ``device``: the package's version, lazy public names (``lazy``),
the module paths that moved (``moved``) and the doors from a layer to one above (``hooks``)."""

from smiexlm.core.version import __version__

__all__ = ["__version__"]
