"""Exceptions shared by the library and the CLI (no heavy imports here)."""


class QtoolError(Exception):
    """A user-facing error: bad input file, bad option, a model qtool cannot handle.

    The CLI prints ``str(error)`` on one line and exits non-zero (no traceback
    unless ``--debug``).
    """
