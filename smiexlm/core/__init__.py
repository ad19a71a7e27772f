"""The shared ground every layer stands on: the package's version (the errors, paths, atomic
writes, settings and device helpers join it as the layers are drawn)."""

from smiexlm.core.version import __version__

__all__ = ["__version__"]
