"""Progress on standard error, for every command that works for more than a
few seconds.

Two kinds, as Keras's ``verbose="auto"`` has them:

- ``step(message)``: a line saying what starts (``> Converting ...``, an
  epoch's result). Printed unless the command prints JSON: standard error
  then keeps only warnings and errors.
- ``bar(description, total)``: a live line for work done in counted pieces
  (training steps, calibration batches, evaluated images): the count, the
  time spent and an estimate of the time left. In a log file or a pipe a
  redrawn line is noise: there a bar is a plain line of its count and status
  every ``PLAIN_LINE_SECONDS`` while it runs.

Imports nothing heavy (rich only when it speaks), so any module may take one.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edgevit.errors import printable

# advance(count=1, status=None): ``count`` more pieces done; ``status`` (a
# running loss, the sub-step under way) shown after the estimate.
Advance = Callable[..., None]


# Off a terminal, how often a running bar prints its state as a line: a log shows the work moving without
# a line per step.
PLAIN_LINE_SECONDS = 30.0


def _ignore(count: int = 1, status: str | None = None) -> None:
    pass


class Progress:
    """Progress lines and bars; silent when ``enabled`` is False (library use,
    ``--json``). ``stream``: where they go (default: standard error)."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self._console = None
        if enabled:
            from rich.console import Console

            # A private handle on stderr by default: the converter's native output is
            # captured through file descriptors 1/2 while progress still shows.
            # (a character standard error's encoding lacks is written as an escape, as Python's own stderr does)
            self._console = Console(file=stream or os.fdopen(os.dup(2), "w", buffering=1, errors="backslashreplace"),
                                    highlight=False)

    @property
    def live(self) -> bool:
        """Whether bars show (progress enabled, on a terminal)."""
        return self._console is not None and self._console.is_terminal

    def step(self, message: str) -> None:
        if self._console:
            from rich.text import Text

            # a message's [brackets] are text; a long line stays one line in a log (the terminal wraps its own)
            self._console.print(Text.assemble((">", "bold"), " ", printable(message)), soft_wrap=True)

    @contextmanager
    def bar(self, description: str, total: int | None, unit: str = "") -> Iterator[Advance]:
        """A bar of ``total`` pieces (None: a count not known beforehand, the
        bar then shows the time spent and the status); yields ``advance``."""
        if self._console is None:
            yield _ignore
            return
        if not self.live:
            yield self._plain_lines(description, total, unit)
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        columns = [TextColumn("  {task.description}"), BarColumn()]
        if total is not None:
            columns += [MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn(), TextColumn("left"),
                        TimeRemainingColumn()]
        else:
            columns.append(TimeElapsedColumn())
        columns.append(TextColumn("{task.fields[status]}"))
        with Bar(*columns, console=self._console, transient=True) as bar:
            task = bar.add_task(description, total=total, status="")

            def advance(count: int = 1, status: str | None = None) -> None:
                bar.update(task, advance=count, **({} if status is None else {"status": status}))

            yield advance

    def _plain_lines(self, description: str, total: int | None, unit: str) -> Advance:
        """``advance`` of a bar off a terminal: a line of the count, the time
        spent and the status when ``PLAIN_LINE_SECONDS`` have passed since
        the bar started or printed."""
        from rich.text import Text

        started = last = time.monotonic()
        done, shown = 0, ""

        def advance(count: int = 1, status: str | None = None) -> None:
            nonlocal done, shown, last
            done += count
            shown = shown if status is None else status
            now = time.monotonic()
            if now - last < PLAIN_LINE_SECONDS:
                return
            last = now
            minutes, seconds = divmod(int(now - started), 60)
            count_text = f"{done}/{total}" if total is not None else f"{done}"
            self._console.print(Text(printable(f"  {description}: {count_text} {unit}, {minutes}:{seconds:02d} spent"
                                               + (f", {shown}" if shown else ""))), soft_wrap=True)

        return advance
