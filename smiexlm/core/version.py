"""The package's version, in a module of its own: a layer low down (a result's record of the
software it ran) reads it without importing the package's top."""

__version__ = "0.1.0"
