"""Errors that carry the name of the bad input field and how to fix it.

Every user-facing failure raises :class:`HetplanError`; the CLI turns it into a one-paragraph message and
exit code 2 (never a traceback).
"""

from __future__ import annotations


class HetplanError(ValueError):
    """A problem with user input or with the request itself (e.g. nothing fits).

    Attributes:
        message: what is wrong.
        field: the input field at fault (e.g. ``"job.global_batch"``), or ``None``.
        fix: one sentence telling the user what to change, or ``None``.
    """

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        self.message = message
        self.field = field
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        """The message as shown to the user: ``field: message. Fix: ...``."""
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class InfeasibleError(HetplanError):
    """The request is well-formed but no plan satisfies it (memory, deadline, budget)."""
