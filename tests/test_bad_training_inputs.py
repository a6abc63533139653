"""Bad inputs of training runs (issue 56): checkpoint folders, epoch plans,
data folders and clusters that finetune and qat must refuse in one
``error:`` line, exit status 1, changing nothing on disk; and what must hold
when a run is killed or interrupted."""
from __future__ import annotations

import os

import pytest

from edgevit.errors import EdgevitError
from tests.test_bad_inputs import SMALL, image_folder, run, snapshot


def _data(tmp, **kw):
    return str(image_folder(tmp / "data", **kw))


def _lock_linked_outside_the_folder(tmp):
    from edgevit.train.checkpoints import LOCK_FILE

    (tmp / "victim.txt").write_text("a file of the user's, outside the checkpoint folder")
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / LOCK_FILE).symlink_to("../victim.txt")
    return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "m.keras"]


BAD_TRAINING_INPUTS = [
    pytest.param(_lock_linked_outside_the_folder, "Checkpoint folder 'ckpt' holds .edgevit-run.lock, the run's lock "
                 "file, but it is a symbolic link (to '../victim.txt'): edgevit neither follows nor writes it",
                 id="lock-is-a-symbolic-link"),
]


@pytest.mark.parametrize("setup, message", BAD_TRAINING_INPUTS)
def test_bad_training_input_is_one_error_line_and_changes_nothing(tmp_path, monkeypatch, setup, message):
    monkeypatch.chdir(tmp_path)
    args = setup(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = run(*args)
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["symbolic link", "hard link", "fifo", "folder"])
def test_a_lock_file_that_is_no_regular_file_of_its_own_is_refused_untouched(tmp_path, kind):
    from edgevit.train.checkpoints import LOCK_FILE, checkpoint_lock

    folder, lock, outside = tmp_path / "ckpt", tmp_path / "ckpt" / LOCK_FILE, tmp_path / "outside.txt"
    folder.mkdir()
    outside.write_text("kept")
    {"symbolic link": lambda: lock.symlink_to(outside), "hard link": lambda: os.link(outside, lock),
     "fifo": lambda: os.mkfifo(lock), "folder": lock.mkdir}[kind]()
    before = snapshot(tmp_path)
    with pytest.raises(EdgevitError, match=f"holds {LOCK_FILE}, the run's lock file, but it is "):
        with checkpoint_lock(folder):
            pass
    assert snapshot(tmp_path) == before
