"""Errors every layer raises: the lowest module of the package, so that no layer imports a
higher one for an exception type."""


class ConfigError(ValueError):
    """User error in the config or workdir, reported as one line before anything is written."""
