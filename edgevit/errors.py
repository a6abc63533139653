"""Errors a user can cause. The CLI prints their message and exits non-zero."""
import errno
from collections.abc import Iterator
from contextlib import contextmanager


class EdgevitError(Exception):
    """A problem with the user's input, reported as one clear message."""


class MissingPackage(EdgevitError):
    """An optional package the input needs is not installed (the input itself may be fine)."""


# What a write that failed half-way raises: a full disk or quota, the shell's file-size limit, a read-only mount.
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def cause(err: OSError) -> str:
    """Why a file operation failed, in words (the system's "File too large"
    does not say that a limit of the shell's, not of the disk, was hit)."""
    if err.errno == errno.EFBIG:
        return "File too large: it exceeds the file-size limit of this shell (`ulimit -f`)"
    return err.strerror or first_line(err)


def first_line(err: BaseException) -> str:
    """The first line of an exception's text (library errors are often long),
    or its type name when it has no text."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextmanager
def about(path) -> Iterator[None]:
    """EdgevitErrors raised in the block name the file ``path`` they are
    about (prefixed with it when they do not)."""
    try:
        yield
    except EdgevitError as err:
        if str(path) in str(err):
            raise
        raise EdgevitError(f"{path}: {err}") from None
