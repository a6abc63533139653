"""How edgevit writes files: checked before any work, written whole or not
at all, and every failure reported as one error naming the file and the cause.

- :func:`check_writable` runs before a command's slow part: the output
  folders must exist and take a new file (a probe file is made and removed,
  which is what catches /proc, read-only mounts and a full disk even for root,
  whom permission bits do not stop).
- :func:`staged` writes a command's outputs into hidden folders beside
  them and moves them into place together only when all were written
  (:func:`replace_all`); a failure or an interruption removes the folders and
  leaves the files that were there before as they were. A write that fails
  is one error naming the output, not the staged file. A process killed
  outright (SIGKILL, the kernel's out-of-memory killer) cannot remove its
  folders: they carry its process id, and the next run that stages in the
  same folder removes those whose process is gone, after finishing the moves
  into place such a process had begun (see :func:`replace_all`): a kill at
  any point leaves the whole previous set of files or the whole new one.
- :func:`temporary_folder` is the scratch folder for files that are no
  output (inputs of a child process), written inside :func:`writing`, which
  gives the same errors.
- :func:`weights_h5` renders a Keras ``.weights.h5`` file in memory, so that
  HDF5 never writes to a disk that can fail half-way (a file-size limit made
  h5py print tracebacks for every open object and then crash the process).
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgevit.errors import EdgevitError, cause, is_control, not_there

STAGING_PREFIX = ".edgevit-"
# In a staging folder whose files are being moved into place: which moves, and their direction (see
# finish_moves); a run that finds it in a killed process's folder finishes them before it removes the folder.
MOVES_RECORD = ".edgevit-moves.json"
# A staging folder or probe file: STAGING_PREFIX, the process id of the run
# that made it, a dash.
STAGED_BY = re.compile(rf"^{re.escape(STAGING_PREFIX)}(\d+)-")
STARTED = time.time()  # about when this process started (edgevit is imported first thing)


def staging_prefix() -> str:
    """The name prefix of this process's staging folders and probe files."""
    return f"{STAGING_PREFIX}{os.getpid()}-"


def remove_stale_staging(folder: Path) -> None:
    """Remove the staging folders and probe files in ``folder`` that a run
    killed outright left: made by a process that is gone, before this one
    started."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        made_by = STAGED_BY.match(entry.name)
        try:
            if made_by is None or _running(int(made_by.group(1))) or entry.stat(follow_symlinks=False).st_mtime \
                    >= STARTED:
                continue
            if entry.is_dir(follow_symlinks=False):
                finish_moves(Path(entry.path))
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # removed meanwhile by another run, not ours to remove, or moves that could not be finished


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; not a process id of this system
        return True
    return True


def write_error(path: str | Path, err: OSError) -> EdgevitError:
    return EdgevitError(f"Could not write {str(path)!r}: {cause(err)}.")


def _probe(folder: Path, refusal: str) -> None:
    """Make and remove a one-byte file in ``folder``; ``refusal`` starts
    the error when it cannot."""
    try:
        fd, name = tempfile.mkstemp(prefix=staging_prefix() + "probe-", dir=folder)
    except OSError as err:
        raise EdgevitError(f"{refusal}: {cause(err)}.") from None
    try:
        os.write(fd, b"\0")
    except OSError as err:
        raise EdgevitError(f"{refusal}: {cause(err)}.") from None
    finally:
        os.close(fd)
        os.unlink(name)


def check_writable(files: list[Path], folders: list[Path] = (), flag: str = "-o") -> None:
    """Fail before any work when one of ``files`` could not be written or one
    of ``folders`` created (siblings in one folder): a missing, read-only or
    special folder (/proc), a full disk, a name longer than the file system
    takes, a folder where a file goes or the other way round, a read-only
    file in the way. ``flag``: the option that named them, for the advice."""
    for path in [*files, *folders]:
        _check_path_text(path, flag)
    parent = files[0].parent
    if not parent.is_dir():
        raise EdgevitError(f"Output folder {str(parent)!r} {not_there(parent)}." if not parent.exists()
                           else f"Output folder {str(parent)!r} is not a folder.")
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):  # the file system does not say
        name_max = 255
    for path in [*files, *folders]:
        length = len(os.fsencode(path.name))
        if length > name_max:
            shown = path.name if len(path.name) <= 40 else f"{path.name[:16]}...{path.name[-20:]}"
            raise EdgevitError(f"Output name {shown!r} is {length} bytes long; this file system takes "
                               f"{name_max}: choose a shorter {flag}.")
    for path in files:
        if path.is_dir():
            raise EdgevitError(f"{str(path)!r} is a folder where a file would be written: "
                               f"move it or choose another {flag}.")
        if path.exists() and not os.access(path, os.W_OK):
            raise EdgevitError(f"{str(path)!r} exists and is read-only; it would be replaced.")
    for path in folders:
        if path.exists() and not path.is_dir():
            raise EdgevitError(f"{str(path)!r} is a file where a folder would be made: "
                               f"move it or choose another {flag}.")
    _probe(parent, f"Output folder {str(parent)!r} does not take new files")


def _check_path_text(path: Path, flag: str) -> None:
    """Refuse a path the system cannot take (longer than PATH_MAX), or whose
    name holds a control character (a line break in a file name breaks
    every command line and listing that names it)."""
    try:
        path_max = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        path_max = 4096
    length = len(os.fsencode(os.path.abspath(path)))
    if length >= path_max:
        raise EdgevitError(f"Output path {str(path)[:40]!r}... is {length:,} bytes long with its folder; this "
                           f"system takes paths of up to {path_max - 1:,}: choose a shorter {flag}.")
    if any(map(is_control, path.name)):
        raise EdgevitError(f"Output name {path.name!r} holds a control character: choose another {flag}.")


def check_folder_writable(folder: Path, what: str) -> None:
    """Fail before any work when files could not be written into ``folder``
    (made with its parents when missing): ``what`` names it in the error."""
    if folder.exists() and not folder.is_dir():
        raise EdgevitError(f"{what} {str(folder)!r} is a file, not a folder: pass a folder.")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise EdgevitError(f"{what} {str(folder)!r} cannot be made: {str(existing)!r} is a file.")
    _probe(existing, f"{what} {str(folder)!r} does not take new files" if existing == folder
           else f"{what} {str(folder)!r} cannot be made in {str(existing)!r}")


class Staging:
    """The hidden folders (one per output folder) a command's outputs are
    written into before they are moved into place (see :func:`staged`)."""

    def __init__(self, finals: list[Path]):
        self.finals = finals
        self.folders: dict[Path, Path] = {}
        for final in finals:
            if final.parent not in self.folders:
                remove_stale_staging(final.parent)
                try:
                    self.folders[final.parent] = Path(tempfile.mkdtemp(prefix=staging_prefix(), dir=final.parent))
                except OSError as err:
                    self.remove()
                    raise write_error(final, err) from None

    def path_of(self, final: Path) -> Path:
        """Where ``final`` is written before it is moved into place."""
        return self.folders[final.parent] / final.name

    @contextmanager
    def writing(self, final: Path) -> Iterator[Path]:
        """The block writes ``final`` at the path it is given; a failure is
        one error naming ``final``."""
        with writing(final):
            yield self.path_of(final)

    def write_bytes(self, final: Path, content: bytes) -> None:
        with self.writing(final) as path:
            path.write_bytes(content)

    def write_text(self, final: Path, text: str) -> None:
        with self.writing(final) as path:
            path.write_text(text, encoding="utf-8")

    def commit(self) -> None:
        replace_all([(self.path_of(final), final) for final in self.finals])

    def remove(self) -> None:
        for folder in self.folders.values():
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def staged(finals: list[Path]) -> Iterator[Staging]:
    """Write ``finals`` through staging folders beside them (see
    :class:`Staging`); when the block ends without error, all are moved into
    place together. On any failure or interruption the staging folders are
    removed and the output folders are left as they were."""
    staging = Staging([Path(f) for f in finals])
    try:
        yield staging
        staging.commit()
    finally:
        staging.remove()


def replace_all(moves: list[tuple[Path, Path]]) -> None:
    """Move each staged file onto its final path, all or nothing: the files
    they replace are moved aside first (beside the staged file) and put back
    if any move fails or is interrupted. The moves are recorded in each
    staging folder first, so that a process killed half-way leaves a record
    from which the next run finishes them (:func:`finish_moves`)."""
    folder = next((final for _, final in moves if final.is_dir() and not final.is_symlink()), None)
    if folder is not None:  # moved aside, it would be deleted with the staging folder
        raise EdgevitError(f"{str(folder)!r} is a folder where a file would be written: move it; nothing was "
                           "replaced.")
    moved_aside, placed = [], []
    current = moves[0][1]
    replaced = [final.exists() for _, final in moves]
    records = {}
    for (staged_file, final), there in zip(moves, replaced):
        records.setdefault(staged_file.parent, []).append(
            [staged_file.name, os.path.relpath(final, staged_file.parent), there])
    try:
        for staging, record in records.items():
            _record_moves(staging, "forward", record)
        for (staged_file, current), there in zip(moves, replaced):
            if there:
                os.replace(current, _aside(staged_file, current))
                moved_aside.append((staged_file, current))
        for staged_file, current in moves:
            os.replace(staged_file, current)
            placed.append(current)
    except BaseException as err:
        for staging, record in records.items():
            try:
                _record_moves(staging, "back", record)
            except OSError:  # a full disk: the moves are undone below all the same
                pass
        for final in placed:
            final.unlink(missing_ok=True)
        for staged_file, final in moved_aside:
            os.replace(_aside(staged_file, final), final)
        if isinstance(err, OSError):
            raise EdgevitError(f"Could not write {str(current)!r}: {cause(err)}; "
                               "the files that were there before are back in place.") from None
        raise


def _aside(staged_file: Path, final: Path) -> Path:
    """Where :func:`replace_all` keeps the file ``final`` held before."""
    return staged_file.parent / ("previous-" + final.name)


def _record_moves(staging: Path, direction: str, moves: list) -> None:
    """Write, whole (renamed into place), the record of the moves out of
    ``staging``: [staged name, final path relative to it, whether a file
    was there], and whether they go ``forward`` or are undone (``back``)."""
    part = staging / (MOVES_RECORD + ".part")
    part.write_text(json.dumps({"direction": direction, "moves": moves}))
    os.replace(part, staging / MOVES_RECORD)


def finish_moves(staging: Path) -> None:
    """Finish the moves into place that a process killed in
    :func:`replace_all` began from ``staging``: forward (every staged file
    placed: the new set), or back when it was undoing them after a failure
    (the files that were there before). Nothing when they had not begun (the
    files in place were not touched)."""
    try:
        record = json.loads((staging / MOVES_RECORD).read_text())
    except FileNotFoundError:
        return
    for staged_name, final_path, replaced in record["moves"]:
        staged_file, final = staging / staged_name, staging / final_path
        if record["direction"] == "forward":
            if staged_file.exists():
                os.replace(staged_file, final)
        elif replaced:
            if _aside(staged_file, final).exists():
                os.replace(_aside(staged_file, final), final)
        elif not staged_file.exists():  # placed where there was no file: removed, as before the moves
            final.unlink(missing_ok=True)


@contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A scratch folder in the system's temporary folder, removed afterwards
    (its files are written inside :func:`writing`)."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix))
    except OSError as err:
        raise EdgevitError(f"Could not make a temporary folder in {tempfile.gettempdir()!r}: {cause(err)} "
                           "(TMPDIR chooses another place).") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """The block writes ``path``: a failure is one error naming it."""
    try:
        yield
    except OSError as err:
        raise write_error(path, err) from None


# Rows of an array-like written at once by save_array (an ImageSet reads its images then).
WRITE_ROWS = 8


def save_array(path: Path, array, dtype=None) -> None:
    """``np.save`` (as ``dtype`` where given) that fails as any other write
    (numpy's own file writes report a short write, "N requested and M
    written", without its cause). ``array``: an array, or anything whose
    slices are arrays (an :class:`~edgevit.data.images.ImageSet`), written a
    slice at a time."""
    import numpy as np

    first = np.ascontiguousarray(array[:WRITE_ROWS], dtype)
    header = {**np.lib.format.header_data_from_array_1_0(first), "shape": (len(array), *first.shape[1:])}
    with writing(path), open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, header)
        file.write(first.tobytes())
        for start in range(WRITE_ROWS, len(array), WRITE_ROWS):
            file.write(np.ascontiguousarray(array[start:start + WRITE_ROWS], dtype).tobytes())


class _NamedBuffer(io.BytesIO):
    """An in-memory file Keras takes for a ``.weights.h5`` path."""

    def __str__(self) -> str:
        return "memory.weights.h5"


def weights_h5(model) -> bytes:
    """The ``.weights.h5`` file of ``model``, rendered in memory."""
    buffer = _NamedBuffer()
    model.save_weights(buffer)
    return buffer.getvalue()


def refuse_existing(paths, overwrite: bool) -> None:
    """An output that exists is replaced only with --overwrite: every command
    names its outputs after its inputs, so an existing one is usually another
    run's, which replacing without a word would lose."""
    existing = [str(p) for p in paths if os.path.lexists(p)]
    if existing and not overwrite:
        names = existing[0] if len(existing) == 1 else ", ".join(existing[:-1]) + " and " + existing[-1]
        exist, them = ("exists", "it") if len(existing) == 1 else ("exist", "them")
        raise EdgevitError(f"{names} already {exist}: pass --overwrite to replace {them}, or choose another "
                           "output with -o.")
