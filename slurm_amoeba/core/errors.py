"""The package's error hierarchy.

Every error slurm_amoeba raises on purpose derives from :class:`AmoebaError`, so callers can catch the package's
failures without catching programming errors. Messages are sentences that name the offending value and, where
possible, the fix.
"""

from __future__ import annotations


class AmoebaError(Exception):
    """Base class of every error slurm_amoeba raises on purpose."""


class SpecError(AmoebaError, ValueError):
    """A user-supplied elastic specification (worker range, resources) is invalid."""


class ParseError(AmoebaError, ValueError):
    """Text from outside the package (command output, a message, a file) could not be understood.

    Attributes:
        source: what was being parsed (e.g. ``"squeue --json"``), for the message.
        excerpt: the start of the offending text, shortened, so the message stays readable.
    """

    def __init__(self, message: str, *, source: str = "", text: str = "") -> None:
        self.source = source
        self.excerpt = text[:200] + ("..." if len(text) > 200 else "")
        full = f"{source}: {message}" if source else message
        if text:
            full += f" (input starts with {self.excerpt!r})"
        super().__init__(full)
