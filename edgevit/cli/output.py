"""How every command talks to the user: user errors as one ``error:`` line and
exit status 1, results as rich tables or JSON, progress and warnings on stderr.

Imports nothing from edgevit but the error class, so any module may use it.
"""
from __future__ import annotations

import functools
import json
import sys

import click

from edgevit.errors import EdgevitError

USER_ERROR_EXIT = 1
INTERRUPTED_EXIT = 130


def user_errors(fn):
    """Turn EdgevitError into one ``error:`` line and exit status 1, and
    Ctrl-C into ``interrupted`` and 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgevitError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(USER_ERROR_EXIT)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED_EXIT)

    return wrapper


def print_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def print_table(title: str | None, columns: list[str], rows: list[list], stream=None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*[str(v) for v in row])
    Console(file=stream or sys.stdout, width=max(100, len(columns) * 14)).print(table)


def log(message: str) -> None:
    """A progress or warning line on stderr (stdout stays clean for --json)."""
    click.echo(message, err=True)


def stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr)
