"""Errors a user can cause. The CLI prints their message and exits non-zero."""


class EdgevitError(Exception):
    """A problem with the user's input, reported as one clear message."""
