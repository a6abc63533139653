"""Errors a user can cause. The CLI prints their message and exits non-zero."""


class EdgevitError(Exception):
    """A problem with the user's input, reported as one clear message."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's text (library errors are often long),
    or its type name when it has no text."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
