"""How every command talks to the user: user errors as one ``error:`` line and
exit status 1, results as rich tables or JSON, progress and warnings on stderr;
and how it stops: Ctrl-C and SIGTERM unwind the command, so temporary and
half-written files are removed on the way out.

Imports nothing from edgevit but the errors, so any module may use it.
"""
from __future__ import annotations

import errno
import functools
import io
import json
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager

import click

from edgevit.errors import EdgevitError, OutOfMemory, cause, printable

USER_ERROR_EXIT = 1
INTERRUPTED_EXIT = 130
TERMINATED_EXIT = 143  # 128 + SIGTERM, what a shell reports for a terminated process


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it unwinds as after
    Ctrl-C: ``finally`` blocks run, temporary folders are removed and child
    processes are killed."""


@contextmanager
def sigterm_unwinds():
    """While the block runs, SIGTERM raises :class:`Terminated`."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def raise_terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class GuardedStdout:
    """Standard output whose write failures (a full disk under ``> FILE``, a
    reader that went away) end the command cleanly: one ``error:`` line, or
    silence for a closed pipe, instead of a traceback. A failure is final:
    the file descriptor then points at /dev/null (so that Python's own flush
    at exit fails no more) and every later write raises it again (click
    swallows the first one when it probes the stream)."""

    def __init__(self, stream):
        self._stream = stream
        self._failure: BaseException | None = None

    def write(self, text):
        return self._guarded(self._stream.write, text)

    def flush(self):
        return self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _guarded(self, operation, *args):
        if self._failure is None:
            try:
                return operation(*args)
            except OSError as err:
                self._failure = (SystemExit(USER_ERROR_EXIT) if isinstance(err, BrokenPipeError) else
                                 EdgevitError(f"Could not write to standard output: {cause(err)}."))
                try:
                    os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
                except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
                    pass
        raise self._failure


class ClosedStream(io.TextIOBase):
    """A standard stream the shell closed (``>&-``), for which Python gives
    None: writing to it fails as writing to a closed descriptor does."""

    def writable(self):
        return True

    def write(self, text):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


def reopen_closed_standard_streams() -> None:
    """Point standard descriptors the shell closed at /dev/null: the next
    file edgevit opened would take a closed one's number, and C++ output
    (TensorFlow's, LiteRT's) meant for the terminal would land in it. A
    closed standard output still fails the first write (one ``error:``
    line, as `ls >&-` fails); a closed standard error just hears nothing."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if name == "stdout":
            sys.stdout = ClosedStream()
        else:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def escape_unencodable_output() -> None:
    """Characters standard output cannot encode (a class name's é under
    PYTHONIOENCODING=ascii) print as escapes, as Python prints them on
    standard error, instead of ending the command in UnicodeEncodeError."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


class ExitAtOnce(SystemExit):
    """An exit the command line's process makes without Python's shutdown
    (see :func:`report_error`)."""


def report_error(message: str, at_once: bool = False) -> None:
    """One ``error:`` line on stderr and exit status 1; ``at_once``: the
    process exits without Python's shutdown, which after an allocation
    TensorFlow could not make waited for ever on a lock its finalizers take
    (`edgevit qat` under `ulimit -v`; the group's ``main`` makes the exit)."""
    click.echo("error: " + printable(" ".join(message.split())), err=True)
    raise (ExitAtOnce if at_once else SystemExit)(USER_ERROR_EXIT)


@contextmanager
def warnings_as_lines():
    """While the block runs, Python warnings (an image folder's skipped
    files) print as ``warning: ...`` lines, without the source line."""
    def show(message, category, filename, lineno, file=None, line=None):
        log(f"warning: {message}")

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def user_errors(fn):
    """Turn EdgevitError into one ``error:`` line and exit status 1 (running
    out of memory too), Ctrl-C into ``interrupted`` and 130, SIGTERM into
    ``terminated`` and 143; warnings print as ``warning:`` lines."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with sigterm_unwinds(), warnings_as_lines():
                return fn(*args, **kwargs)
        except OutOfMemory as err:
            report_error(str(err), at_once=True)
        except EdgevitError as err:
            report_error(str(err))
        except MemoryError:
            report_error("Out of memory: close other programs, raise the shell's limit (`ulimit -v`), or ask for "
                         "less (a smaller --input-size or --batch-size, fewer images).", at_once=True)
        except Terminated:
            click.echo("terminated", err=True)
            sys.exit(TERMINATED_EXIT)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)

    return wrapper


def print_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def print_table(title: str | None, columns: list[str], rows: list[list], stream=None, width: int | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=plain(title) if title else None, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*[plain(v) for v in row])
    Console(file=stream or sys.stdout, width=width or max(100, len(columns) * 14)).print(table)


def plain(value) -> str:
    """``value`` as rich shows it to the letter: a class or file name such as
    "[/x]" is text, not markup, and its control characters are escapes."""
    from rich.markup import escape

    return escape(printable(str(value)))


def log(message: str) -> None:
    """A progress or warning line on stderr (stdout stays clean for --json)."""
    click.echo(printable(message), err=True)


def stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr)
