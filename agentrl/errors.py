"""Errors the user fixes, told apart from bugs: one message, no traceback, exit status 2."""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A config, file, layout or run folder that cannot work; the message names what is wrong and the fix."""


class RefusedOnEveryRank(UserError):
    """A UserError that every rank of the job raises at the same point (before training starts).

    No rank has to abort the others: rank 0 prints the message once and every rank exits
    with EXIT_USER_ERROR.
    """
