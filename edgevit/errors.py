"""Errors a user can cause, and the words they are said in: why a path
cannot be read, text a terminal shows rather than acts on, a path as one
word of a command to copy. The CLI prints their message and exits non-zero."""
import errno
import os
import shlex
import stat
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager


class EdgevitError(Exception):
    """A problem with the user's input, reported as one clear message."""


class MissingPackage(EdgevitError):
    """An optional package the input needs is not installed (the input itself may be fine)."""


class OutOfMemory(EdgevitError):
    """A stage ran out of memory: TensorFlow may be left holding locks its
    exit waits for, so the command ends at once after saying so."""


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


def file_problem(path) -> str | None:
    """Why ``path`` is not a regular file to read, in words that follow its
    name (None: it is one). A FIFO or a device (/dev/zero) would block or
    never end, a folder has no bytes, a symbolic link may lead nowhere."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ELOOP):
            return not_there(path)
        return f"cannot be read: {cause(err)}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (a named pipe), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a file"
    return "is not a regular file"


def not_there(path) -> str:
    """Why ``path``, which cannot be opened, is not there, in words: it does
    not exist, or it is a symbolic link that loops or points at nothing."""
    if not os.path.islink(path):
        return "does not exist"
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link that loops back to itself"
    return f"is a symbolic link to {os.readlink(path)!r}, which does not exist"


def is_control(character: str) -> bool:
    """Whether ``character`` is a control character (NUL, BEL, ESC, a line
    break, ...), which a terminal acts on instead of showing."""
    return unicodedata.category(character) == "Cc"


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes, so that a
    name a file or a folder chose is shown on a terminal, not acted on by
    it; line breaks and tabs stay. So are the lone surrogates a name that is
    not UTF-8 decodes to (no stream can encode them: a progress line that
    named such a file ended the command in UnicodeEncodeError)."""
    return "".join(c if c in "\n\t" or not (is_control(c) or unicodedata.category(c) == "Cs") else repr(c)[1:-1]
                   for c in text)


def shell_word(path) -> str:
    """``path`` as one word of a command a user copies into a shell: quoted
    where it holds spaces or quotes, and ./-prefixed where it starts with a
    dash (`cd -demo` would read an option)."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


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
