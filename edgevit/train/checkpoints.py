"""Training checkpoints, the one place that names, writes and reads them:
after every epoch the weights, optimizer state and epoch go to a folder
with a description of the run (``TrainConfig.run``, :func:`write_checkpoint`); a
run started with the same folder resumes after the last finished epoch when
it is the same run and is refused when it is not. The command removes the
checkpoint once the trained model is saved. While a run uses the folder it
holds a lock there (:func:`checkpoint_lock`), so that a second run started
meanwhile is refused rather than sharing it. In a run across workers only
the chief reads, writes and locks the folder.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import stat
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError, cause, first_line
from edgevit.writing import remove_stale_staging, staged, weights_h5

# Written together through a staging folder (edgevit.writing.staged): a failed or
# interrupted save leaves the last checkpoint whole and nothing else; a save killed
# outright while moving them into place is finished by the next run that locks the folder.
CHECKPOINT_FILES = ("last.weights.h5", "optimizer.npz", "state.json")
# Held (flock) by the run that uses the folder; the kernel releases it when that process ends, however it ends.
LOCK_FILE = ".edgevit-run.lock"


def _describe_run(run: dict) -> str:
    if not run:
        return "a run this edgevit did not record"
    classes = run.get("classes") or []
    return (f"{run.get('command', '?')} of {run.get('model', '?')} at {run.get('input_size', '?')} px, "
            f"{len(classes)} classes ({', '.join(map(str, classes[:4]))}{' ...' if len(classes) > 4 else ''})")


def _differences(saved: dict, run: dict) -> str:
    """The fields in which the checkpoint's run and this one differ, with
    both values (two descriptions alike but for a field not described read
    as the same run)."""
    if not saved:
        return f"this run: {_describe_run(run)}"

    def shown(value) -> str:
        text = "absent" if value is None else json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."

    fields = [key for key in [*saved, *(k for k in run if k not in saved)] if saved.get(key) != run.get(key)]
    return "it differs in " + "; ".join(f"{key} (the checkpoint's: {shown(saved.get(key))}, this run's: "
                                         f"{shown(run.get(key))})" for key in fields)


def checkpoint_state(checkpoint_dir: str | Path, run: dict) -> dict | None:
    """The saved state of ``checkpoint_dir`` when it holds a checkpoint of
    ``run`` (None when it holds none); an error naming the folder and how to
    start fresh when it holds another run's or a damaged one."""
    folder = Path(checkpoint_dir)
    if folder.exists() and not folder.is_dir():
        raise EdgevitError(f"Checkpoint folder {str(folder)!r} is a file, not a folder: "
                           "pass another --checkpoint-dir.")
    state = folder / "state.json"
    if not state.exists():
        return None
    try:
        info = json.loads(state.read_text())
    except (OSError, ValueError):
        raise _damaged(folder, "state.json unreadable") from None
    saved = (info.get("run") or {}) if isinstance(info, dict) else {}
    if isinstance(saved, dict) and saved != run:
        raise EdgevitError(f"Checkpoint folder {str(folder)!r} holds another run ({_describe_run(saved)}, "
                           f"{json.dumps(info.get('epochs_done'))} epoch(s) done; {_differences(saved, run)}): "
                           f"{start_fresh(folder)}.")
    problem = state_problem(info)
    if problem:
        raise _damaged(folder, f"state.json: {problem}")
    return info


def _damaged(folder: Path, why: str) -> EdgevitError:
    return EdgevitError(f"Checkpoint folder {str(folder)!r} is damaged ({why}): {start_fresh(folder)}.")


def read_checkpoint(checkpoint_dir: str | Path, run: dict, model, optimizer) -> dict | None:
    """Restore ``model``'s weights and ``optimizer``'s state from
    ``checkpoint_dir`` when it holds a checkpoint of ``run``, and return its
    state (``epochs_done``, ``history``); None when it holds none."""
    info = checkpoint_state(checkpoint_dir, run)
    if info is None:
        return None
    folder = Path(checkpoint_dir)
    variables = optimizer.variables
    arrays = read_optimizer_state(folder, [(tuple(v.shape), v.dtype) for v in variables])  # all checked first
    try:
        model.load_weights(folder / CHECKPOINT_FILES[0])
    except Exception as err:  # h5py and Keras raise many types for missing or damaged files
        raise _damaged(folder, first_line(err)) from None
    for var, array in zip(variables, arrays):
        var.assign(array)
    return info


def write_checkpoint(checkpoint_dir: str | Path, model, optimizer, epochs_done: int, history: list[dict],
                     run: dict) -> None:
    """Write the checkpoint of ``epochs_done`` epochs of ``run`` to
    ``checkpoint_dir``, its files together (a failed or interrupted write
    leaves the previous checkpoint whole); the folder is made when missing,
    and removed again when the first write fails."""
    folder = Path(checkpoint_dir)
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EdgevitError(f"Could not make the checkpoint folder {str(folder)!r}: {cause(err)}.") from None
    optimizer_state = io.BytesIO()
    np.savez(optimizer_state, **{f"v{i}": np.asarray(v) for i, v in enumerate(optimizer.variables)})
    state = {"epochs_done": epochs_done, "history": history, "run": run}
    paths = [folder / name for name in CHECKPOINT_FILES]
    try:
        with staged(paths) as staging:
            weights, opt, state_file = paths
            staging.write_bytes(weights, weights_h5(model))
            staging.write_bytes(opt, optimizer_state.getvalue())
            staging.write_text(state_file, json.dumps(state))
    except BaseException:
        if made:  # the first save: nothing of this run is left behind
            remove_checkpoint(folder)
        raise


def state_problem(info) -> str | None:
    """What is wrong with a checkpoint's state.json document as a Trainer
    writes it (None: nothing): a whole number of epochs done, a history of
    one record per epoch done, a run description."""
    if not isinstance(info, dict):
        return f"a JSON {_json_kind(info)}, not an object"
    epochs_done, history = info.get("epochs_done"), info.get("history", [])
    if type(epochs_done) is not int or epochs_done < 0:
        return f"epochs_done is {json.dumps(epochs_done)}, not a number of epochs"
    if not isinstance(history, list):
        return f"history is a JSON {_json_kind(history)}, not a list of the epochs' records"
    if len(history) != epochs_done:
        return f"history holds {len(history)} record(s), not one per epoch done ({epochs_done})"
    for number, record in enumerate(history, 1):
        if not (isinstance(record, dict) and record.get("epoch") == number
                and all(isinstance(record.get(key, 0), (int, float)) and not isinstance(record.get(key), bool)
                        for key in ("loss", "val_top1"))):
            return f"history record {number} is not the record of epoch {number}"
    if not isinstance(info.get("run", {}), dict):
        return "run is not a description of a run"
    return None


def _json_kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value),
                                                                                                 "number")


def read_optimizer_state(checkpoint_dir: str | Path, variables: list[tuple[tuple[int, ...], str]]) -> list:
    """The arrays of the checkpoint's optimizer.npz, one per optimizer
    variable of ``variables`` ((shape, dtype) each), read whole and checked
    before any is used: an error naming the folder when the file holds
    other arrays, arrays of Python objects (never unpickled), or fails its
    checksums."""
    folder = Path(checkpoint_dir)
    expected = [f"v{i}.npy" for i in range(len(variables))]
    arrays = []
    try:
        with zipfile.ZipFile(folder / CHECKPOINT_FILES[1]) as archive:
            if sorted(archive.namelist()) != sorted(expected):
                raise EdgevitError(f"Checkpoint in {str(folder)!r} does not fit this run (its optimizer state has "
                                   f"{len(archive.namelist())} arrays, this run's optimizer {len(variables)}: another "
                                   f"model or optimizer): {start_fresh(folder)}.")
            for name, (shape, dtype) in zip(expected, variables):
                with archive.open(name) as member:  # the header first: nothing of another size is read
                    version = np.lib.format.read_magic(member)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)(member)
                found_shape, _, found_dtype = header
                if found_dtype.hasobject or tuple(found_shape) != tuple(shape) or found_dtype != np.dtype(dtype):
                    raise _damaged(folder, f"{CHECKPOINT_FILES[1]}: {name[:-4]} is {found_dtype} {tuple(found_shape)}, "
                                           f"the optimizer's variable {np.dtype(dtype)} {tuple(shape)}")
                with archive.open(name) as member:
                    arrays.append(np.lib.format.read_array(member, allow_pickle=False))
    except EdgevitError:
        raise
    except Exception as err:  # zipfile, numpy: a bad checksum, a cut file, a header that is not numpy's
        raise _damaged(folder, f"{CHECKPOINT_FILES[1]}: {first_line(err)}") from None
    return arrays


@contextmanager
def checkpoint_lock(checkpoint_dir: str | Path):
    """Hold ``checkpoint_dir`` for this run while the block runs: another
    edgevit run that asks for it meanwhile is refused (two runs that had not
    yet saved a checkpoint both went on, and the first to finish deleted the
    folder under the other). Made here when missing, and removed afterwards
    when this made it and nothing is left in it. Only the chief of a run
    across workers calls it: the other workers leave the folder alone."""
    folder = Path(checkpoint_dir)
    if folder.exists() and not folder.is_dir():
        yield  # a file there is refused by checkpoint_state, in words
        return
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _locked(folder / LOCK_FILE)
    except OSError as err:
        raise EdgevitError(f"Could not make the checkpoint folder {str(folder)!r}: {cause(err)}.") from None
    # A run killed while it moved a checkpoint into place: its moves are finished (or undone) before the
    # checkpoint is read, so that this run resumes from it rather than starting over and deleting it.
    remove_stale_staging(folder)
    try:
        yield
    finally:
        if fd is not None:
            _remove_own_lock(folder / LOCK_FILE, fd)
            os.close(fd)
        if made:
            try:
                folder.rmdir()
            except OSError:  # it holds a checkpoint to resume from, or files of the user's
                pass


def _locked(lock: Path) -> int | None:
    """A descriptor of ``lock`` holding an exclusive flock with this
    process's id in it; None on a file system without locks. A lock that is
    a symbolic link, a hard link or no regular file is refused, never
    followed: the run truncates the file it locks and writes its pid there,
    which through a link would be a file outside the folder."""
    while True:
        try:
            # O_NONBLOCK: a FIFO put there opens at once, to be refused below, instead of blocking
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise EdgevitError(_not_a_lock(lock, f"a symbolic link (to {os.readlink(lock)!r})")) from None
            if err.errno == errno.EISDIR:
                raise EdgevitError(_not_a_lock(lock, "a folder")) from None
            raise
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
            os.close(fd)
            raise EdgevitError(_not_a_lock(lock, "not a regular file" if not stat.S_ISREG(status.st_mode)
                                           else f"a hard link ({status.st_nlink} names of one file)"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                return None
            raise EdgevitError(f"Checkpoint folder {str(lock.parent)!r} is in use by another edgevit run (process "
                               f"{holder}): wait for it to end, or pass another --checkpoint-dir.") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the run that held it ended and removed it meanwhile: take a fresh one
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _not_a_lock(lock: Path, what: str) -> str:
    return (f"Checkpoint folder {str(lock.parent)!r} holds {lock.name}, the run's lock file, but it is {what}: "
            f"edgevit neither follows nor writes it; remove {str(lock)!r}, or pass another --checkpoint-dir.")


def _remove_own_lock(lock: Path, fd: int) -> None:
    """Remove ``lock`` before its flock is released (a run that starts then
    finds a free folder), unless it is already another run's."""
    try:
        if os.stat(lock).st_ino == os.fstat(fd).st_ino:
            lock.unlink()
    except FileNotFoundError:  # removed with the checkpoint
        pass


def start_fresh(folder: Path) -> str:
    """How to start afresh, deleting only what a Trainer wrote."""
    if folder.is_dir() and any(p.name not in (*CHECKPOINT_FILES, LOCK_FILE) for p in folder.iterdir()):
        return (f"delete its checkpoint files ({', '.join(CHECKPOINT_FILES)}) to start fresh, "
                "or pass another --checkpoint-dir")
    return f"delete it (rm -r {str(folder)!r}) to start fresh, or pass another --checkpoint-dir"


def remove_checkpoint(checkpoint_dir: str | Path) -> None:
    """Delete the files a Trainer wrote to ``checkpoint_dir`` and the run's
    lock, and the folder when nothing else is in it."""
    folder = Path(checkpoint_dir)
    for name in (*CHECKPOINT_FILES, LOCK_FILE):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # absent, or holds files of the user's: left as it is
        pass
