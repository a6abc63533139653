"""Progress on standard error, for every command that works for more than a
few seconds.

Two kinds, as Keras's ``verbose="auto"`` has them:

- ``step(message)``: a line saying what starts (``> Converting ...``, an
  epoch's result). Printed unless the command prints JSON: standard error
  then keeps only warnings and errors.
- ``bar(description, total)``: a live line for work done in counted pieces
  (training steps, calibration batches, evaluated images): the count, the
  time spent and an estimate of the time left. Shown only on a terminal: in a
  log file or a pipe a redrawn line is noise.

Imports nothing heavy (rich only when it speaks), so any module may take one.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# advance(count=1, status=None): ``count`` more pieces done; ``status`` (a
# running loss, the sub-step under way) shown after the estimate.
Advance = Callable[..., None]


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
            self._console = Console(file=stream or os.fdopen(os.dup(2), "w", buffering=1), highlight=False)

    @property
    def live(self) -> bool:
        """Whether bars show (progress enabled, on a terminal)."""
        return self._console is not None and self._console.is_terminal

    def step(self, message: str) -> None:
        if self._console:
            from rich.text import Text

            self._console.print(Text.assemble((">", "bold"), " ", message))  # a message's [brackets] are text

    @contextmanager
    def bar(self, description: str, total: int | None, unit: str = "") -> Iterator[Advance]:
        """A bar of ``total`` pieces (None: a count not known beforehand, the
        bar then shows the time spent and the status); yields ``advance``."""
        if not self.live:
            yield _ignore
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
