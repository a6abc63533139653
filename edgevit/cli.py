"""The `edgevit` command line.

Every command reports user errors (``EdgevitError``) as one line on stderr and
exits with status 1; results print as a table, or as JSON with ``--json``.
"""
from __future__ import annotations

import functools
import json
import sys

import click

from edgevit.errors import EdgevitError


def user_errors(fn):
    """Turn EdgevitError (and a missing input file) into a clean exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgevitError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgevit")
def main():
    """Vision transformers from Keras 3 to fully-int8 LiteRT models on phones."""


@main.command("list")
@click.argument("pattern", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def list_command(pattern, as_json):
    """List registered models (optionally matching a shell PATTERN, e.g. 'mobilevit_v3*')."""
    from edgevit.registry import get_spec, list_models

    specs = [get_spec(n) for n in list_models(pattern)]
    if not specs:
        raise EdgevitError(f"No model matches {pattern!r}.")
    if as_json:
        print_json([{"name": s.name, "family": s.family, "input_size": s.default_input_size} for s in specs])
        return
    print_table(None, ["model", "family", "input size"],
                [[s.name, s.family, s.default_input_size] for s in specs])


@main.command("info")
@click.argument("name")
@click.option("--input-size", type=int, default=None, help="Count MACs at this input size.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@user_errors
def info_command(name, input_size, as_json):
    """Parameters, MACs, input size and preprocessing of model NAME."""
    from edgevit.info import model_info

    info = model_info(name, input_size=input_size)
    if as_json:
        print_json(info)
        return
    rows = [[k, v] for k, v in info.items() if k != "preprocessing"]
    rows += [[f"preprocessing.{k}", v] for k, v in info["preprocessing"].items()]
    print_table(name, ["field", "value"], rows)


if __name__ == "__main__":
    main()
