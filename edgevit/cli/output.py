"""How every command talks to the user: user errors as one ``error:`` line and
exit status 1, results as rich tables or JSON, progress and warnings on stderr;
and how it stops: Ctrl-C and SIGTERM unwind the command, so temporary and
half-written files are removed on the way out.

Imports nothing from edgevit but the error class, so any module may use it.
"""
from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from contextlib import contextmanager

import click

from edgevit.errors import EdgevitError

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


def report_error(message: str) -> None:
    """One ``error:`` line on stderr and exit status 1."""
    click.echo("error: " + " ".join(message.split()), err=True)
    sys.exit(USER_ERROR_EXIT)


def user_errors(fn):
    """Turn EdgevitError into one ``error:`` line and exit status 1, Ctrl-C
    into ``interrupted`` and 130, SIGTERM into ``terminated`` and 143."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with sigterm_unwinds():
                return fn(*args, **kwargs)
        except EdgevitError as err:
            report_error(str(err))
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

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*[str(v) for v in row])
    Console(file=stream or sys.stdout, width=width or max(100, len(columns) * 14)).print(table)


def log(message: str) -> None:
    """A progress or warning line on stderr (stdout stays clean for --json)."""
    click.echo(message, err=True)


def stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr)
