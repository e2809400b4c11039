"""The package's error hierarchy.

Every error slurm_amoeba raises on purpose derives from :class:`AmoebaError`, so callers can catch the package's
failures without catching programming errors. Messages are sentences that name the offending value and, where
possible, the fix.
"""

from __future__ import annotations

from collections.abc import Mapping


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


def unknown_key_message(what: str, key: str, valid: Mapping[str, object]) -> str:
    """The one sentence every refusal of an unknown key uses: the key, then every valid key with its default.

    Configuration sections, policy knobs and executor parameters all refuse a key they do not know with this
    message, so a user meets one wording everywhere and always sees what they could have written instead.

    Args:
        what: where the key was given, e.g. ``"amoebad.yaml"`` or ``"policy 'e-tiresias'"``.
        key: the unknown key as the user wrote it (a full path such as ``agents.timout_s`` where there is one).
        valid: every valid key -> its default, in the order to list them.

    Returns:
        ``"<what>: unknown key '<key>'; valid keys (with their defaults) are: a=1, b='x'"`` (``none`` when there is
        no valid key).
    """
    listed = ", ".join(f"{name}={default!r}" for name, default in valid.items()) or "none"
    return f"{what}: unknown key {key!r}; valid keys (with their defaults) are: {listed}"
