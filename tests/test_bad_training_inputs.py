"""Bad inputs of training runs (issue 56): checkpoint folders, epoch plans,
data folders and clusters that finetune and qat must refuse in one
``error:`` line, exit status 1, changing nothing on disk; and what must hold
when a run is killed or interrupted."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgevit import writing
from edgevit.errors import EdgevitError
from tests.test_bad_inputs import SMALL, image_folder, one_error_line_and_nothing_changed, run, snapshot


def _data(tmp, **kw):
    return str(image_folder(tmp / "data", **kw))


def _lock_linked_outside_the_folder(tmp):
    from edgevit.train.checkpoints import LOCK_FILE

    (tmp / "victim.txt").write_text("a file of the user's, outside the checkpoint folder")
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / LOCK_FILE).symlink_to("../victim.txt")
    return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "m.keras"]


def _class_folder_linked_to_another(tmp):
    data = image_folder(tmp / "data")
    (data / "train" / "wasps").symlink_to("ants")
    return ["finetune", *SMALL, "--data", "data", "-o", "m.keras"]


def _class_folder_without_images(tmp):
    data = image_folder(tmp / "data")
    (data / "train" / "wasps").mkdir()
    (data / "train" / "flies").mkdir()
    (data / "train" / "flies" / "notes.txt").write_text("no image")
    return ["qat", *SMALL, "--data", "data", "-o", "q.keras"]


# What `finetune mobilevit_v3_xxs --input-size 64` on ants and bees records as its run.
THIS_RUN = {"command": "finetune", "model": "mobilevit_v3_xxs", "input_size": 64, "classes": ["ants", "bees"],
            "sizes": []}


def _checkpoint_stating(state: dict):
    def setup(tmp):
        (tmp / "ckpt").mkdir()
        (tmp / "ckpt" / "state.json").write_text(json.dumps({"run": THIS_RUN, **state}))
        return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "m.keras"]

    return setup


def _checkpoint_of_this_run_but(**changed):
    def setup(tmp):
        (tmp / "ckpt").mkdir()
        (tmp / "ckpt" / "state.json").write_text(json.dumps({"run": {**THIS_RUN, **changed}, "epochs_done": 1,
                                                             "history": [{"epoch": 1}]}))
        return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "m.keras"]

    return setup


def _qat_of_b_with_the_checkpoint_of_qat_of_a(tmp):
    from edgevit.registry import create_model
    from edgevit.saving import save_model
    from edgevit.train.run import file_identity

    for name in ("A.keras", "B.keras"):  # two trainings of one model: its name alike, its weights not
        save_model(create_model("mobilevit_v3_xxs", num_classes=2, input_size=64), tmp / name)
    (tmp / "ckpt").mkdir()
    run = {**THIS_RUN, "command": "qat", "source": file_identity(tmp / "A.keras")}
    (tmp / "ckpt" / "state.json").write_text(json.dumps({"run": run, "epochs_done": 1, "history": [{"epoch": 1}]}))
    return ["qat", "B.keras", "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "q.keras"]


def _images_all_unreadable(tmp, split: str, command: str):
    data = image_folder(tmp / "data")
    for image in (data / split).rglob("*.png"):
        image.write_bytes(b"not a png")
    return [command, *SMALL, "--data", "data", "-o", "m.keras"]


@pytest.fixture(scope="module")
def qat_weights(tmp_path_factory):
    """The weights of a QAT model, as a QAT checkpoint holds them (last.weights.h5), and the QAT .keras."""
    from edgevit.quantize.qat import quantize_model
    from edgevit.registry import create_model
    from edgevit.saving import save_model

    folder = tmp_path_factory.mktemp("qat")
    qat = quantize_model(create_model("mobilevit_v3_xxs", num_classes=2, input_size=64), input_range=(0.0, 1.0))
    qat.save_weights(folder / "last.weights.h5")
    save_model(qat, folder / "q.keras")
    return folder


@pytest.mark.parametrize("name", ["last.weights.h5", "q.keras"])
def test_a_qat_models_weights_given_as_weights_are_refused_in_one_line(tmp_path, monkeypatch, qat_weights, name):
    """A QAT checkpoint's weights given as --weights ended in a cut Keras line
    ('A total of 125 objects could not be loaded. Example error message for object ...:')."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copy(qat_weights / name, tmp_path / name)
    args = ["finetune", *SMALL, "--data", _data(tmp_path), "--weights", name, "-o", "m.keras"]
    before = snapshot(tmp_path)
    code, _, err = run(*args)
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --weights {name} holds the weights of a quantization-aware (QAT) model, which fit "
                          "no float model"), err
    assert snapshot(tmp_path) == before


def _checkpoint_with_a_foreign_optimizer_state(tmp):
    """A checkpoint of this run whose optimizer state is one array of Python
    objects: refused by its count before any is read (never unpickled)."""
    import numpy as np

    args = _checkpoint_stating({"epochs_done": 1, "history": [{"epoch": 1, "loss": 0.5}]})(tmp)
    np.savez(tmp / "ckpt" / "optimizer.npz", v0=np.asarray([None, 1], object))
    return args


BAD_TRAINING_INPUTS = [
    pytest.param(_checkpoint_with_a_foreign_optimizer_state, "Checkpoint in 'ckpt' does not fit this run (its "
                 "optimizer state has 1 arrays", id="checkpoint-optimizer-state-of-another-model"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--worker-timeout", "nan", "-o", "m.keras"],
                 "Invalid value for '--worker-timeout': 'nan' is not a number of seconds", id="worker-timeout-nan"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--worker-timeout", "inf", "-o", "m.keras"],
                 "Invalid value for '--worker-timeout': inf is not in the range 1<=x<=86400", id="worker-timeout-inf"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "m.keras", "-o",
                              "m.keras"], "-o m.keras is also the --checkpoint-dir: the checkpoint folder and the "
                 "trained model cannot share a path", id="output-is-the-checkpoint-dir"),
    pytest.param(_qat_of_b_with_the_checkpoint_of_qat_of_a, "holds another run (qat of mobilevit_v3_xxs at 64 px, 2 "
                 "classes (ants, bees), 1 epoch(s) done; it differs in source (the checkpoint's: \"A.keras sha256:",
                 id="qat-of-b-resuming-qat-of-a"),
    pytest.param(lambda tmp: _images_all_unreadable(tmp, "val", "qat"), "None of the 4 validation images could be "
                 "read: 4 unreadable image(s) skipped: 4 not an image, or damaged", id="every-val-image-unreadable"),
    pytest.param(lambda tmp: _images_all_unreadable(tmp, "train", "finetune"), "None of the 4 training images read "
                 "first (to estimate BatchNorm statistics or calibrate the ranges) could be read: 4 unreadable "
                 "image(s) skipped", id="every-train-image-unreadable"),
    pytest.param(_checkpoint_of_this_run_but(steps_per_epoch=100), "holds another run (finetune of mobilevit_v3_xxs "
                 "at 64 px, 2 classes (ants, bees), 1 epoch(s) done; it differs in steps_per_epoch (the checkpoint's: "
                 "100, this run's: absent)): delete it", id="checkpoint-of-other-steps-per-epoch"),
    pytest.param(_checkpoint_of_this_run_but(sizes=[64, 96]), "it differs in sizes (the checkpoint's: [64, 96], this "
                 "run's: [])", id="checkpoint-of-other-multiscale"),
    pytest.param(_checkpoint_stating({"epochs_done": -1, "history": []}), "Checkpoint folder 'ckpt' is damaged "
                 "(state.json: epochs_done is -1, not a number of epochs): delete it (rm -r 'ckpt') to start fresh",
                 id="checkpoint-epochs-done-negative"),
    pytest.param(_checkpoint_stating({"epochs_done": 1, "history": "epoch 1"}), "Checkpoint folder 'ckpt' is damaged "
                 "(state.json: history is a JSON string, not a list of the epochs' records)",
                 id="checkpoint-history-not-a-list"),
    pytest.param(_checkpoint_stating({"epochs_done": 1, "history": [{"epoch": 1, "val_top1": "best"}]}),
                 "(state.json: history record 1 is not the record of epoch 1)", id="checkpoint-history-record-odd"),
    pytest.param(_class_folder_linked_to_another, "Class folders 'ants' and 'wasps' in 'data/train' are one folder "
                 "('wasps' is a symbolic link to 'ants'): their images would count under two labels",
                 id="class-folder-linked-to-another"),
    pytest.param(_class_folder_without_images, "Class folder(s) of 'data/train' without images: 'flies' holds no "
                 "image file (1 other entry), 'wasps' is empty; each class folder names a label",
                 id="class-folders-without-images"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp, per_class=1, splits=("",)), "--val-split",
                              "0.5", "-o", "m.keras"], "--val-split 0.5 holds out every image of class(es) ",
                 id="val-split-leaves-a-class-without-training-images"),
    pytest.param(_lock_linked_outside_the_folder, "Checkpoint folder 'ckpt' holds .edgevit-run.lock, the run's lock "
                 "file, but it is a symbolic link (to '../victim.txt'): edgevit neither follows nor writes it",
                 id="lock-is-a-symbolic-link"),
]


@pytest.mark.parametrize("setup, message", BAD_TRAINING_INPUTS)
def test_bad_training_input_is_one_error_line_and_changes_nothing(tmp_path, monkeypatch, setup, message):
    one_error_line_and_nothing_changed(tmp_path, monkeypatch, setup, message)


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


# A checkpoint save as the training loop makes it, in a process that kills itself (SIGKILL) just before its
# os.replace call number argv[2] (and, with argv[3], makes call argv[3] fail first, as a full disk would).
_KILLED_SAVE = textwrap.dedent("""\
    import json, os, signal, sys
    from pathlib import Path
    from edgevit.train.checkpoints import CHECKPOINT_FILES
    from edgevit.writing import staged
    folder, kill_at, fail_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    calls, replace = [0], os.replace
    def counted(src, dst):
        calls[0] += 1
        if calls[0] == fail_at:
            raise OSError(28, "No space left on device")
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)
    os.replace = counted
    with staged([folder / name for name in CHECKPOINT_FILES]) as staging:
        for name in CHECKPOINT_FILES[:2]:
            staging.write_bytes(folder / name, b"epoch 2")
        staging.write_text(folder / "state.json", json.dumps({"epochs_done": 2, "history": [{"epoch": 1}, {"epoch": 2}],
                                                             "run": {}}))
""")


def _checkpoint_of_epoch(folder, epoch: int) -> None:
    from edgevit.train.checkpoints import CHECKPOINT_FILES

    folder.mkdir(exist_ok=True)
    for name in CHECKPOINT_FILES[:2]:
        (folder / name).write_bytes(f"epoch {epoch}".encode())
    (folder / "state.json").write_text(json.dumps({"epochs_done": epoch, "run": {},
                                                   "history": [{"epoch": e} for e in range(1, epoch + 1)]}))


# os.replace calls of a save: the record of the moves, three files moved aside, three placed
@pytest.mark.parametrize("kill_at, fail_at", [(k, 0) for k in range(1, 9)] + [(k, 6) for k in range(7, 12)])
def test_a_save_killed_at_any_point_of_its_moves_leaves_a_checkpoint_the_next_run_resumes(tmp_path, monkeypatch,
                                                                                           kill_at, fail_at):
    """A SIGKILL while a checkpoint was moved into place left the old and new
    checkpoints in a hidden staging folder; the rerun started at epoch 1 and
    deleted that folder."""
    from edgevit.train.checkpoints import CHECKPOINT_FILES, checkpoint_lock, checkpoint_state

    folder = tmp_path / "ckpt"
    _checkpoint_of_epoch(folder, 1)
    killed = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(folder), str(kill_at), str(fail_at)],
                            capture_output=True, text=True)
    assert killed.returncode in (-signal.SIGKILL, 1 if fail_at else 0), killed.stderr
    monkeypatch.setattr(writing, "STARTED", time.time())  # the next run starts after the killed one
    with checkpoint_lock(folder):
        epochs_done = checkpoint_state(folder, {})["epochs_done"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(CHECKPOINT_FILES)
    assert [(folder / name).read_bytes() for name in CHECKPOINT_FILES[:2]] == [f"epoch {epochs_done}".encode()] * 2
    # killed before the record of its moves: the previous checkpoint; after it: the new one; after a failed move
    # (6), once the record says the moves are undone (call 7 renames it): the previous one
    assert epochs_done == (1 if kill_at == 1 or fail_at and kill_at > 7 else 2)


def _cluster(task_type="worker", index=0, **cluster) -> str:
    return json.dumps({"cluster": cluster or {"worker": ["localhost:12345", "localhost:12346"]},
                       "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize("tf_config, message", [
    (_cluster(index=-1), "TF_CONFIG does not describe a cluster this process is part of (task index -1 of worker, "
                         "which has 2 address(es): 0 to 1)"),
    (_cluster(index=2), "(task index 2 of worker, which has 2 address(es): 0 to 1)"),
    (_cluster("evaluator", chief=["localhost:1"], worker=["localhost:2"]),
     "TF_CONFIG makes this process an 'evaluator' task, which edgevit does not run: training across workers takes "
     "chief and worker tasks only"),
    (_cluster("evaluator", chief=["localhost:1"], evaluator=["localhost:2"]), "makes this process an 'evaluator'"),
    (_cluster("ps", chief=["localhost:1"], ps=["localhost:2"]), "makes this process a 'ps' task"),
    (_cluster(worker=["localhost:1"], ps=["localhost:2"]), "TF_CONFIG's cluster has ps task(s), which edgevit does "
                                                          "not run"),
    (_cluster(worker=["localhost"]), "TF_CONFIG's cluster address 'localhost' is not host:port"),
], ids=["index-negative", "index-beyond", "evaluator-outside-the-cluster", "evaluator-in-the-cluster", "ps",
        "cluster-with-ps", "address-without-port"])
def test_a_tf_config_task_that_does_not_train_in_the_cluster_is_refused_in_one_line(monkeypatch, tf_config,
                                                                                    message):
    """Task index -1 trained as the last worker; an evaluator trained alone and wrote -o."""
    from edgevit.train.distribute import cluster_of_environment

    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(EdgevitError) as refused:
        cluster_of_environment()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_worker_port_already_in_use_is_refused_before_tensorflow_starts_its_server(monkeypatch):
    import socket

    from edgevit.train.distribute import check_own_port, cluster_of_environment

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("TF_CONFIG", _cluster(index=1, worker=["localhost:1", f"localhost:{port}"]))
        with pytest.raises(EdgevitError, match=rf"^TF_CONFIG gives this process \(worker 1\) the address "
                                               rf"localhost:{port}, but port {port} is in use by another process"):
            check_own_port(cluster_of_environment())


def test_the_fields_in_which_workers_runs_differ_are_named():
    import numpy as np

    from edgevit.train.distribute import _field_hashes, run_disagreement

    run = {"model": "mobilevit_v3_xxs", "input_size": 64, "epochs": 2, "steps_per_epoch": None}
    other = {**run, "input_size": 96}
    rows = np.stack([_field_hashes(run)[1], _field_hashes(run)[1], _field_hashes(other)[1], _field_hashes(other)[1]])
    assert run_disagreement(run, rows[:2]) is None
    assert run_disagreement(run, rows) == "input_size: 64 here, as on 2 of 4 replicas"
    assert run_disagreement(other, rows) == "input_size: 96 here, as on 2 of 4 replicas"


# Two workers of one cluster that compare run descriptions: argv[1] is the task index, argv[2] the ports,
# argv[3] the input size of this worker's run.
_AGREEING_WORKER = textwrap.dedent("""\
    import json, os, sys
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in sys.argv[2].split(",")]},
                                          "task": {"type": "worker", "index": int(sys.argv[1])}})
    from edgevit.errors import EdgevitError
    from edgevit.train.distribute import agree_on_run, strategy_for_environment
    strategy = strategy_for_environment(60)
    try:
        agree_on_run(strategy, {"model": "m", "input_size": int(sys.argv[3]), "epochs": 2}, timeout=60)
    except EdgevitError as err:
        print("error:", err)
    else:
        print("agreed")
""")


@pytest.mark.slow  # 23 s on 2 busy cores: two TensorFlow processes start a cluster
def test_workers_started_with_other_runs_each_refuse_naming_the_field(tmp_path):
    """Two workers at --input-size 64 and 96 trained together; the last
    ended with a misleading 'a worker did not answer'."""
    import socket

    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = ",".join(str(s.getsockname()[1]) for s in sockets)
    for s in sockets:
        s.close()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", _AGREEING_WORKER, str(index), ports, size], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for index, size in enumerate(("64", "96"))]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for (out, err), size in zip(outputs, ("64", "96")):
        assert out.strip() == ("error: Training across workers (TF_CONFIG): the workers were started with different "
                               f"runs (input_size: {size} here, as on 1 of 2 replicas): start every worker with the "
                               "same command, model file and data."), err[-2000:]


def test_a_folder_link_in_a_class_folder_is_named_as_a_link_not_a_file(tmp_path):
    from edgevit.data.folders import find_dataset, find_evaluation_images
    from edgevit.data.listing import left_out_summary

    data = image_folder(tmp_path / "data")
    (data / "train" / "ants" / "more").symlink_to(tmp_path)
    (data / "train" / "bees" / "notes.txt").write_text("no image")
    left_out = find_dataset(data).left_out
    assert left_out == ["train/ants/more/", "train/bees/notes.txt"]
    assert left_out_summary(left_out).endswith("left out: train/bees/notes.txt; 1 folder link(s) not followed (a link "
                                               "may loop back up; copy or move the images into the class folder "
                                               "instead): train/ants/more/")
    (data / "val" / "wasps").mkdir()
    with pytest.warns(UserWarning, match="class folder.s. of .*val without images, not scored: 'wasps' is empty"):
        find_evaluation_images(data)


# A PNG of argv[2] x argv[2] black pixels opened under an address-space limit 150 MB above what the process
# holds: its decoded pixels do not fit.
_DECODED_UNDER_A_LIMIT = textwrap.dedent("""\
    import re, resource, struct, sys, zlib
    from pathlib import Path
    from edgevit.data.decode import UnreadableImage, open_rgb
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    side, compress = int(sys.argv[2]), zlib.compressobj()
    rows = b"".join(compress.compress(b"\\0" * (3 * side + 1)) for _ in range(side)) + compress.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # 8-bit RGB
    Path(sys.argv[1]).write_bytes(b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows)
                                  + chunk(b"IEND", b""))
    held = int(re.search(r"VmSize:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (held + 150_000_000, resource.RLIM_INFINITY))
    try:
        open_rgb(sys.argv[1])
    except UnreadableImage as err:
        print(err.reason)
""")


def test_an_image_that_does_not_fit_in_memory_is_not_counted_as_damaged(tmp_path):
    """A valid 13,000-px PNG under a memory limit was counted as 'not an image, or damaged'."""
    from edgevit.data.decode import OUT_OF_MEMORY

    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc here")
    decoded = subprocess.run([sys.executable, "-c", _DECODED_UNDER_A_LIMIT, str(tmp_path / "big.png"), "9000"],
                             capture_output=True, text=True, timeout=120)
    assert decoded.stdout.strip() == OUT_OF_MEMORY, decoded.stderr[-2000:]


def _optimizer_state(folder, arrays: dict) -> None:
    import numpy as np

    folder.mkdir(exist_ok=True)
    np.savez(folder / "optimizer.npz", **arrays)


@pytest.mark.parametrize("arrays, damage, message", [
    ({"v0": [1], "v1": [[0.0] * 3] * 2}, None, None),
    ({"v0": [1], "v1": [0.0] * 3}, None, "optimizer.npz: v1 is float64 (3,), the optimizer's variable float64 (2, 3)"),
    ({"v0": [1], "v1": [[None] * 3] * 2}, None, "optimizer.npz: v1 is object (2, 3)"),
    ({"v0": [1]}, None, "its optimizer state has 1 arrays, this run's optimizer 2"),
    ({"v0": [1], "v1": [[0.0] * 3] * 2}, "crc", "optimizer.npz: Bad CRC-32 for file 'v1.npy'"),
    ({"v0": [1], "v1": [[0.0] * 3] * 2}, "cut", "optimizer.npz: File is not a zip file"),
], ids=["whole", "wrong-shape", "object-array", "too-few-arrays", "bad-crc", "cut"])
def test_a_damaged_optimizer_state_is_refused_in_one_line_before_any_is_used(tmp_path, arrays, damage, message):
    """Optimizer entries of another shape, object arrays and a bad CRC ended
    in tracebacks (or unpickled an object array)."""
    import numpy as np

    from edgevit.train.checkpoints import read_optimizer_state

    folder = tmp_path / "ckpt"
    _optimizer_state(folder, {name: np.asarray(value, object if None in np.ravel(value) else None)
                              for name, value in arrays.items()})
    path = folder / "optimizer.npz"
    if damage == "crc":  # the last byte of v1's data changed (np.savez stores them uncompressed)
        import zipfile

        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("v1.npy")
        content = bytearray(path.read_bytes())
        name_and_extra = int.from_bytes(content[info.header_offset + 26:info.header_offset + 28], "little") + \
            int.from_bytes(content[info.header_offset + 28:info.header_offset + 30], "little")
        content[info.header_offset + 30 + name_and_extra + info.compress_size - 1] ^= 0xFF
        path.write_bytes(bytes(content))
    elif damage == "cut":
        path.write_bytes(path.read_bytes()[:100])
    expected = [((1,), "int64"), ((2, 3), "float64")]
    if message is None:
        assert [a.shape for a in read_optimizer_state(folder, expected)] == [(1,), (2, 3)]
        return
    with pytest.raises(EdgevitError) as refused:
        read_optimizer_state(folder, expected)
    assert message in str(refused.value) and str(refused.value).startswith("Checkpoint "), refused.value


@pytest.mark.slow  # 30-60 s: TensorFlow starts and the step is traced before the signal
def test_a_billion_steps_an_epoch_start_at_once_in_bounded_memory_and_sigterm_ends_them(tmp_path):
    """--steps-per-epoch 1000000000 on 8 images: 4.9 GB in 2 minutes before
    the first step, and SIGTERM not honoured (11.3 GB after 5 minutes)."""
    image_folder(tmp_path / "data", per_class=4)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "edgevit", "finetune", "mobilevit_v3_xxs", "--input-size", "32",
                             "--data", "data", "--epochs", "1", "--steps-per-epoch", "1000000000", "--batch-size",
                             "4", "-o", "m.keras"], cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE)
    seen = ""
    while "Building the training step's graph" not in seen:
        line = proc.stderr.readline()
        assert line, seen[-3000:]
        seen += line
    time.sleep(5)  # into the steps
    rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text()).group(1)) * 1024
    proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().endswith("terminated"), (seen + err)[-3000:]
    assert time.monotonic() - stopped < 15
    assert rss < 3e9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no output, no checkpoint folder


def _tiny_classifier(size: int = 16):
    import keras

    inputs = keras.Input((size, size, 3))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3, name="conv")(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x), name="tiny")


@pytest.mark.parametrize("case", ["only more memory", "no batch fits", "multiscale", "batch"])
def test_an_out_of_memory_refusal_names_the_setting_that_drives_the_need(monkeypatch, case):
    """QAT under `ulimit -v` and --multiscale 64,1024 were told to use a
    smaller batch, which changed nothing, in numbers that read alike
    ('2.2 GB left, needs about 2.2 GB')."""
    from edgevit import memory

    model = _tiny_classifier(128)
    batches = {128: 8, 512: 1} if case == "multiscale" else None
    weights, images, fixed = memory.need_parts("training", model, 8, memory.ADDRESS_SPACE_NEEDS, batches)
    left = {"only more memory": fixed - 1e6, "no batch fits": weights + fixed - 1e3,
            "multiscale": weights + fixed + images / 2, "batch": weights + fixed + images * 5 / 8}[case]
    monkeypatch.setattr(memory, "available_memory", lambda: None)
    monkeypatch.setattr(memory, "address_space_left", lambda: (4_000_000 * 1024, int(left)))
    with pytest.raises(EdgevitError) as refused:
        with memory.memory_of("training", model, 8, batches):
            raise AssertionError("the stage ran")
    message = str(refused.value)
    assert re.search(r"([0-9.]+) GB of it is left, and the stage needs about ([0-9.]+) GB", message)
    shown_left, shown_need = re.search(r"([0-9.]+) GB of it is left, and the stage needs about ([0-9.]+) GB",
                                       message).groups()
    assert shown_left != shown_need, message
    assert message.endswith({
        "only more memory": "raise the limit (`ulimit -v unlimited`) (TensorFlow's part of the stage alone takes "
                            "about 1.05 GB, whatever the model and batch).",
        "no batch fits": "TensorFlow's part 1.05 GB, whatever the batch: train a smaller model.",
        "multiscale": "or leave 512 out of --multiscale: its steps take 1 image(s) of 512 px, about 0.01 GB (a "
                      "step's batch is scaled to the pixels of --batch-size images at 128 px, but never below one "
                      "image).",
        "batch": "or use a --batch-size of 5 or less (the images of a step take about 0.01 GB)."}[case]), message


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_eval_names_a_file_whose_name_is_not_utf8_in_its_progress_lines(tmp_path, locale):
    """A non-UTF-8 file name in an eval folder ended the progress line in UnicodeEncodeError."""
    from tests.test_bad_inputs import edgevit_tflite

    data = image_folder(tmp_path / "data")
    edgevit_tflite(tmp_path / "m.tflite")
    (data / "val" / "bees" / os.fsdecode(b"caf\xe9.txt")).write_text("no image")
    (data / "val" / "bees" / os.fsdecode(b"caf\xe9.png")).write_text("no image either")
    env = dict(os.environ, LC_ALL=locale, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-m", "edgevit", "eval", "m.tflite", "--data", "data"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, errors="replace", timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "val/bees/caf\\udce9.txt" in proc.stderr and "images scored" in proc.stdout, proc.stderr[-3000:]


def test_what_workers_agree_on_names_the_options_and_the_data_they_differ_in(tmp_path):
    """Workers at --input-size 64 and 96, with other --epochs or other data
    trained together: what they compare before step 1 tells them apart."""
    import numpy as np

    from edgevit.registry import get_spec
    from edgevit.train.distribute import _field_hashes, run_disagreement
    from edgevit.train.run import Finetune, RunOptions

    spec = get_spec("mobilevit_v3_xxs")
    image_folder(tmp_path / "a")
    image_folder(tmp_path / "b", per_class=3)

    def agreed(data="a", epochs=2, size=64):
        run = Finetune(RunOptions("mobilevit_v3_xxs", str(tmp_path / data), str(tmp_path / "m.keras"), epochs=epochs,
                                  input_size=size))
        return run.agreed(run.describe(spec, size))

    mine = agreed()
    for other, fields in ((agreed(size=96), ["input_size"]), (agreed(epochs=3), ["epochs"]), (agreed("b"), ["data"])):
        rows = np.stack([_field_hashes(mine)[1], _field_hashes(other)[1]])
        assert [part.split(":")[0] for part in run_disagreement(mine, rows).split("; ")] == fields
    assert run_disagreement(mine, np.stack([_field_hashes(mine)[1]] * 2)) is None
