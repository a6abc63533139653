"""Bad and unusual inputs over every command.

Each bad input ends in exit status 1, exactly one ``error:`` line on stderr
and no traceback, and leaves the folder it ran in as it was: nothing written,
nothing changed. Unusual images are read as the Android demo reads them, or
skipped and counted by reason; eval scores every image it is given; class
names travel from training into the converted file's labels; SIGTERM and a
failed replace leave no partial output."""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
import zlib
from contextlib import contextmanager
from pathlib import Path

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgevit.cli import main
from edgevit.data.decode import FLOAT_PIXELS, NOT_AN_IMAGE, TOO_LARGE, open_rgb
from edgevit.errors import EdgevitError
from edgevit.export import pipeline
from edgevit.writing import replace_all
from tests import hostile_files as hostile
from tests.helpers import tiny_tflite

SMALL = ["mobilevit_v3_xxs", "--input-size", "64"]


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def snapshot(folder: Path) -> dict:
    """Every path under ``folder`` (hidden ones too) with a hash of its
    content; a symbolic link with where it points, a FIFO or a device as such."""
    def state(path: Path) -> str:
        if path.is_symlink():
            return "link to " + os.readlink(path)
        if path.is_dir():
            return "folder"
        return hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "special file"

    return {str(p.relative_to(folder)): state(p) for p in sorted(folder.rglob("*"))}


def image_folder(root: Path, classes=("ants", "bees"), per_class=2, splits=("train", "val")) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for index, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                pixels = rng.integers(0, 80, (40, 48, 3)).astype(np.uint8)
                pixels[..., index % 3] += 150
                Image.fromarray(pixels).save(folder / f"{j}.png")
    return root


def png_claiming(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width`` x ``height`` pixels (no pixel data):
    what Pillow's decompression-bomb check looks at."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path


def edgevit_tflite(path: Path, classes=("ants", "bees")) -> Path:
    """A small .tflite file with edgevit metadata (embedded and as sidecars),
    as `edgevit convert` writes it: what eval, bench and bundle read."""
    from edgevit.litert.metadata import build_metadata, embed

    content = tiny_tflite(path).read_bytes()
    meta = build_metadata(
        model_name="plain", family="plain", precision="fp32", weights="random-init", labels=list(classes),
        labels_file=path.stem + ".labels.txt", graph_input={"shape": [1, 8, 8, 3], "dtype": "float32",
                                                            "quantization": None},
        graph_output={"shape": [1, len(classes)], "dtype": "float32", "quantization": None},
        preprocessing={"input_size": 8, "resize_size": 8, "interpolation": "bilinear", "mean": [0.0] * 3,
                       "std": [1.0] * 3, "value_range": [0.0, 1.0]})
    path.write_bytes(embed(content, meta, list(classes)))
    path.with_suffix(".json").write_text(json.dumps(meta))
    path.with_name(path.stem + ".labels.txt").write_text("\n".join(classes) + "\n")
    return path


def demo_folder(root: Path) -> Path:
    """The parts of an Android demo checkout that bundle looks at."""
    demo = root / "demo"
    (demo / "app" / "src" / "main" / "assets").mkdir(parents=True)
    (demo / ".edgevit-android-demo").write_text("")
    (demo / "app" / "src" / "main" / "AndroidManifest.xml").write_text("<manifest/>")
    return demo


def special_folder() -> str:
    """A folder that takes no new file even for root (Linux's /proc)."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    return "/proc"


@contextmanager
def file_size_limit(limit: int):
    """What `ulimit -f` does, for this process and its children: writes past
    ``limit`` bytes fail with EFBIG (Python ignores the SIGXFSZ signal)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


# Each setup prepares its inputs in the folder the command runs in and returns the arguments.

def _data(tmp, **kw):
    return str(image_folder(tmp / "data", **kw))


def _sidecar_is_a_folder(tmp):
    (tmp / "a.labels.txt").mkdir()
    (tmp / "a.report.json").write_text("{}")  # from an earlier run: must stay as it is
    return ["convert", "--fp32", *SMALL, "-o", "a.tflite"]


def _output_is_a_folder(tmp):
    (tmp / "out.tflite").mkdir()
    return ["convert", *SMALL, "-o", "out.tflite"]


def _finetune_output_is_a_folder(tmp):
    (tmp / "m.keras").mkdir()
    return ["finetune", *SMALL, "--data", _data(tmp), "-o", "m.keras"]


def _qat_output_is_its_input(tmp):
    (tmp / "m.keras").write_bytes(b"the float model")
    return ["qat", "m.keras", "--data", _data(tmp), "-o", "m.keras"]


def _finetune_output_is_its_weights(tmp):
    (tmp / "w.keras").write_bytes(b"the starting weights")
    return ["finetune", *SMALL, "--data", _data(tmp), "--weights", "w.keras", "-o", "./w.keras"]


def _convert_output_exists(tmp):
    (tmp / "m.keras").write_bytes(b"a fine-tuned model")
    (tmp / "m_int8.tflite").write_bytes(b"the int8 file of another run")
    return ["convert", "--int8", "m.keras"]  # named after m.keras


def _convert_output_of_these_weights_exists(tmp):
    (tmp / "w_int8.report.json").write_text("{}")
    return ["convert", "--int8", "mobilevit_v3_xxs", "--weights", "w.weights.h5"]  # named after the weights


def _convert_output_of_imagenet_weights_exists(tmp):
    (tmp / "mobilevit_v3_xxs_imagenet_fp16.tflite").write_bytes(b"converted earlier")
    return ["convert", "--fp16", "mobilevit_v3_xxs", "--weights", "imagenet"]  # refused before any download


def _finetune_output_exists(tmp):
    (tmp / "m.keras").write_bytes(b"an earlier run's model")
    return ["finetune", *SMALL, "--data", _data(tmp), "-o", "m.keras"]


def _qat_export_exists(tmp):
    (tmp / "q_int8.report.json").write_text("{}")
    return ["qat", *SMALL, "--data", _data(tmp), "--export", "-o", "q.keras"]


def _imported_weights_exist(tmp):
    (tmp / "mobilevit_v3_xxs.weights.h5").write_bytes(b"weights imported from another checkpoint")
    return ["import-weights", "x.pth", "--model", "mobilevit_v3_xxs"]


def _another_runs_checkpoint(tmp):
    checkpoint = tmp / "m.keras.ckpt"
    checkpoint.mkdir()
    run_of_another_model = {"command": "finetune", "model": "mobilevit_v1_xxs", "input_size": 64,
                            "classes": ["ants", "bees"], "sizes": []}
    (checkpoint / "state.json").write_text(json.dumps({"epochs_done": 3, "history": [],
                                                       "run": run_of_another_model}))
    return ["finetune", *SMALL, "--data", _data(tmp), "-o", "m.keras"]


_HELD_LOCKS = []  # descriptors of the lock that "another run" holds, for the rest of the session


def _checkpoint_folder_in_use(tmp):
    """Another run, still before its first checkpoint, holds the folder."""
    import fcntl

    from edgevit.train.checkpoints import LOCK_FILE

    (tmp / "ckpt").mkdir()
    fd = os.open(tmp / "ckpt" / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242")
    _HELD_LOCKS.append(fd)
    return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "ckpt", "-o", "m.keras"]


def _another_runs_checkpoint_among_the_users_files(tmp):
    args = _another_runs_checkpoint(tmp)
    (tmp / "m.keras.ckpt" / "notes.txt").write_text("the user's notes")
    return args


def _weights_of_another_class_count(tmp):
    from edgevit import create_model

    create_model("mobilevit_v3_xxs", num_classes=10, input_size=64).save_weights(tmp / "w10.weights.h5")
    return ["convert", "--fp32", *SMALL, "--weights", "w10.weights.h5"]


def _truncated_tflite(tmp):
    content = tiny_tflite(tmp / "whole.tflite").read_bytes()
    (tmp / "whole.tflite").unlink()
    (tmp / "cut.tflite").write_bytes(content[:len(content) // 2])
    return ["eval", "cut.tflite", "--data", _data(tmp)]


def _random_bytes_checkpoint(tmp):
    pytest.importorskip("torch")
    (tmp / "random.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    return ["import-weights", "random.pt", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


def _safetensors_with_header(tmp, header: bytes):
    (tmp / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return ["import-weights", "x.safetensors", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


class _RunsACommand:
    """Unpickled, it would run `touch pwned` (the folder's snapshot shows it did not)."""

    def __reduce__(self):
        return os.system, ("touch pwned",)


def _pickle_that_runs_a_command(tmp):
    pytest.importorskip("torch")
    import pickle

    (tmp / "evil.pt").write_bytes(pickle.dumps({"weight": _RunsACommand()}, protocol=2))
    return ["import-weights", "evil.pt", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


def _checkpoint_that_inflates_like_a_bomb(tmp):
    """A PyTorch zip checkpoint whose 65 MiB tensor is deflated to 66 KB
    (torch loads it: such a file of a few MB is gigabytes in memory)."""
    torch = pytest.importorskip("torch")
    import io
    import zipfile

    saved = io.BytesIO()
    torch.save({"weight": torch.zeros(65 << 18)}, saved)
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(tmp / "bomb.pt", "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in source.infolist():
            bomb.writestr(info.filename, source.read(info))
    return ["import-weights", "bomb.pt", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


def _loose_images(tmp):
    (tmp / "loose").mkdir()
    Image.new("RGB", (8, 8)).save(tmp / "loose" / "a.png")
    tiny_tflite(tmp / "m.tflite")
    return ["eval", "m.tflite", "--data", "loose"]


def _calibration_bomb(tmp):
    (tmp / "calib").mkdir()
    png_claiming(tmp / "calib" / "huge.png", 15000, 15000)
    return ["convert", "--int8", *SMALL, "--calib", "calib", "-o", "m.tflite"]


def _checkpoint_dir_is_a_file(tmp):
    (tmp / "notes").write_text("the user's notes")
    return ["finetune", *SMALL, "--data", _data(tmp), "--checkpoint-dir", "notes", "-o", "m.keras"]


def _keras_file_to_import(tmp):
    (tmp / "model.keras").write_bytes(b"PK\x03\x04 a Keras archive")
    return ["import-weights", "model.keras", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


def _junk_keras_archive(tmp):
    import zipfile

    with zipfile.ZipFile(tmp / "junk.keras", "w") as archive:
        archive.writestr("config.json", b"\xa5\x00 not JSON")
    return ["convert", "--fp32", "junk.keras"]


def _keras_archive_with_a_bomb(member):
    """A .keras file one of whose members inflates from 65 KB to 65 MiB."""
    def setup(tmp):
        import zipfile

        with zipfile.ZipFile(tmp / "bomb.keras", "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("config.json", b"{}" if member != "config.json" else b" " * (65 << 20))
            archive.writestr("metadata.json", b"{}")
            archive.writestr("model.weights.h5", b"\0" * (65 << 20) if member == "model.weights.h5" else b"")
        return ["convert", "--fp32", "bomb.keras"]
    return setup


def _keras_model_with_python_code(tmp):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2)], name="mobilevit_v3_xxs")
    model.save(tmp / "lambda.keras")
    return ["convert", "--fp32", "lambda.keras"]


def _class_folder_named_in_latin1(tmp, command):
    data = image_folder(tmp / "data")
    for split in ("train", "val"):
        os.rename(data / split / "bees", os.fsencode(data / split) + b"/caf\xe9")  # 'café' in Latin-1
    if command == "eval":
        return ["eval", edgevit_tflite(tmp / "m.tflite").name, "--data", "data"]
    return ["finetune", *SMALL, "--data", "data", "-o", "m.keras"]


def _model_with_a_class_name_that_is_not_utf8(tmp):
    """A .keras file an earlier edgevit wrote from such a folder."""
    from edgevit.saving import save_model

    model = tiny_classifier()
    model.name = "mobilevit_v3_xxs"
    model.edgevit_class_names = ("ants", "caf\udce9")
    save_model(model, tmp / "m.keras")
    return ["convert", "--fp32", "m.keras"]


def _tflite_of_variable_input_size(tmp):
    """What a converter writes for an input of shape (1, None, None, 3)."""
    from edgevit.litert.flatbuffer import read_model, write_model

    content = tiny_tflite(tmp / "fixed.tflite").read_bytes()
    (tmp / "fixed.tflite").unlink()
    model = read_model(content)
    graph = model.subgraphs[0]
    graph.tensors[graph.inputs[0]].shapeSignature = [1, -1, -1, 3]
    (tmp / "variable.tflite").write_bytes(write_model(model, len(content)))
    return ["bench", "variable.tflite", "--runs", "1"]


def _tflite_with_metadata_text(tmp, text: bytes, command: str):
    """An edgevit .tflite file whose embedded metadata is ``text``, without sidecars."""
    from edgevit.litert.metadata import METADATA_NAME

    path = edgevit_tflite(tmp / "m.tflite")
    for sidecar in (tmp / "m.json", tmp / "m.labels.txt"):
        sidecar.unlink()
    path.write_bytes(hostile.with_entry(path.read_bytes(), METADATA_NAME, text))
    if command == "eval":
        return ["eval", "m.tflite", "--data", _data(tmp)]
    demo_folder(tmp)
    return ["bundle", "m.tflite", "--android-demo", "demo"]


def _bundle_with_a_sidecar_nested_deeply(tmp):
    args, _, _ = _bundle_over_the_limit(tmp)
    (tmp / "m.json").write_text("[" * 100_000 + "]" * 100_000)
    return args


def _empty_class_folder(tmp):
    data = image_folder(tmp / "data", classes=("ants",), splits=("",))
    (data / "bees").mkdir()
    return ["finetune", *SMALL, "--data", "data", "-o", "m.keras"]


def _truncated_second_model(tmp):
    content = tiny_tflite(tmp / "a.tflite").read_bytes()
    (tmp / "b.tflite").write_bytes(content[:len(content) // 2])
    return ["bench", "--models", "a.tflite", "b.tflite", "--threads", "1", "--runs", "1"]


def _checkpoint_with_few_matching_names(tmp):
    from edgevit.converters.checkpoints import write_safetensors

    write_safetensors({"conv_1.block.conv.weight": np.zeros((16, 3, 3, 3), np.float32),
                       "head.weight": np.zeros((2, 8), np.float32)}, tmp / "few.safetensors")
    return ["import-weights", "few.safetensors", "--model", "mobilevit_v3_xxs", "-o", "w.weights.h5"]


def _many_loose_images(tmp):
    """A data folder of 20,000 entries, images with no class folders (what a
    folder of 10^6 entries is, in the time a test has)."""
    folder = tmp / "many"
    folder.mkdir()
    for index in range(20_000):
        (folder / f"{index}.jpg").touch()
    return ["finetune", *SMALL, "--data", "many", "-o", "m.keras"]


def _calibration_folder_missing(tmp):
    return ["convert", "--int8", *SMALL, "--calib", "missing"]


BAD_INPUTS = [
    # click's own usage errors exit 1 like every other user error, not 2
    pytest.param(lambda tmp: ["convert", "--fp64", "mobilevit_v3_xxs"], "No such option", id="unknown-option"),
    pytest.param(lambda tmp: ["finetune", "mobilevit_v3_xxs", "-o", "m.keras"], "Missing option '--data'",
                 id="missing-option"),
    # contradictory or meaningless arguments
    pytest.param(lambda tmp: ["convert", "--fp32", "--int8", *SMALL], "--fp32 and --int8 contradict",
                 id="two-precisions"),
    pytest.param(lambda tmp: ["convert", "--int8", *SMALL, "--num-classes", "1"], "at least 2 classes",
                 id="int8-one-class"),
    pytest.param(lambda tmp: ["import-weights", "x.pth", "--model", "mobilevit_v3_xxs", "--num-classes", "0"],
                 "at least 2 classes", id="import-zero-classes"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--lr", "-1", "-o", "m.keras"],
                 "learning rate must be a positive number", id="negative-lr"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--val-split", "1.5", "-o", "m.keras"],
                 "between 0 and 1", id="val-split-above-one"),
    pytest.param(lambda tmp: ["convert", "mobilevit_v3_xxs", "--input-size", "9984"], "above 1024 px",
                 id="input-size-above-bound"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--multiscale", "64,4096", "-o", "m.keras"],
                 "4096 px is above 1024 px", id="multiscale-above-bound"),
    pytest.param(lambda tmp: ["info", tiny_tflite(tmp / "m.tflite").name], "`edgevit info` describes registered",
                 id="info-of-a-file"),
    pytest.param(lambda tmp: ["info", "MOBILEVIT_V3_XXS"], "Unknown model 'MOBILEVIT_V3_XXS'. Did you mean: "
                 "mobilevit_v3_xxs", id="model-name-in-capitals"),
    # output paths, checked before any work
    pytest.param(_output_is_a_folder, "is a folder where a file would be written", id="output-is-a-folder"),
    pytest.param(_sidecar_is_a_folder, "a.labels.txt' is a folder", id="sidecar-is-a-folder"),
    pytest.param(lambda tmp: ["convert", *SMALL, "-o", "x" * 246 + ".tflite"], "bytes long; this file system takes",
                 id="output-name-too-long"),
    pytest.param(_finetune_output_is_a_folder, "is a folder where a file would be written",
                 id="finetune-output-is-a-folder"),
    pytest.param(_qat_output_is_its_input, "is the input m.keras", id="qat-output-is-its-input"),
    pytest.param(_finetune_output_is_its_weights, "is the input w.keras", id="finetune-output-is-its-weights"),
    # an existing output may come from another model, precision or input: replaced only with --overwrite
    pytest.param(_convert_output_exists, "m_int8.tflite already exists: pass --overwrite to replace it, or choose "
                 "another output with -o.", id="convert-output-exists"),
    pytest.param(_convert_output_of_these_weights_exists, "w_int8.report.json already exists",
                 id="convert-output-of-these-weights-exists"),
    pytest.param(_convert_output_of_imagenet_weights_exists, "mobilevit_v3_xxs_imagenet_fp16.tflite already exists",
                 id="convert-output-of-imagenet-weights-exists"),
    pytest.param(_finetune_output_exists, "m.keras already exists: pass --overwrite", id="finetune-output-exists"),
    pytest.param(_qat_export_exists, "q_int8.report.json already exists: pass --overwrite", id="qat-export-exists"),
    pytest.param(_imported_weights_exist, "mobilevit_v3_xxs.weights.h5 already exists: pass --overwrite",
                 id="imported-weights-exist"),
    # qat (and finetune) data and model arguments
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp, splits=("val",)), "-o", "q.keras"],
                 "has val/ but no train/", id="qat-data-without-train"),
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp, classes=("ants",)), "-o", "q.keras"],
                 "one class only", id="qat-one-class"),
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp), "--epochs", "0", "-o", "q.keras"],
                 "0 is not in the range", id="qat-zero-epochs"),
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp), "--steps-per-epoch", "0", "-o", "q.keras"],
                 "0 is not in the range", id="qat-zero-steps-per-epoch"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--worker-timeout", "0", "-o", "m.keras"],
                 "0 is not in the range", id="finetune-zero-worker-timeout"),
    pytest.param(_many_loose_images, "its images lie directly in it", id="finetune-20000-loose-images"),
    pytest.param(lambda tmp: ["qat", "mobilevit_v3_xxs", "--input-size", "100", "--data", _data(tmp),
                              "-o", "q.keras"], "Input size 100 does not work", id="qat-input-size-off-grid"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--weights", "missing.weights.h5",
                              "-o", "m.keras"], "'missing.weights.h5' does not exist", id="missing-weights"),
    pytest.param(_another_runs_checkpoint, "holds another run (finetune of mobilevit_v1_xxs",
                 id="another-runs-checkpoint"),
    # files that are not what they claim
    pytest.param(_weights_of_another_class_count, "(512, 10) in the file, the model needs (512, 1000) "
                 "(the file holds a 10-class classifier: pass --num-classes 10)", id="weights-of-10-classes"),
    pytest.param(_truncated_tflite, "Truncated or not a .tflite file", id="truncated-tflite"),
    pytest.param(lambda tmp: ["eval", tiny_tflite(tmp / "plain.tflite").name, "--data", _data(tmp)],
                 "without edgevit metadata", id="eval-foreign-tflite"),
    pytest.param(_random_bytes_checkpoint, "not a PyTorch checkpoint", id="random-bytes-checkpoint"),
    pytest.param(_checkpoint_that_inflates_like_a_bomb, "Could not read checkpoint 'bomb.pt': its member "
                 "archive/data/0 would inflate from", id="checkpoint-zip-bomb"),
    pytest.param(_pickle_that_runs_a_command, "Could not read checkpoint 'evil.pt': it asks to run posix.system when "
                 "it is loaded, which edgevit never does", id="pickle-that-runs-a-command"),
    pytest.param(lambda tmp: _safetensors_with_header(tmp, b"[" * 100_000 + b"]" * 100_000),
                 "Could not read checkpoint 'x.safetensors' as safetensors: its JSON header nests too deeply",
                 id="safetensors-header-nested-deeply"),
    pytest.param(lambda tmp: _safetensors_with_header(tmp, b"[1, 2]"), "its header is a JSON list, not an object",
                 id="safetensors-header-a-list"),
    pytest.param(lambda tmp: ["eval", tiny_tflite(tmp / "m.tflite").name, "--data",
                              str(image_folder(tmp / "data", splits=("train",)))], "has train/ but no val/",
                 id="eval-data-without-val"),
    pytest.param(_loose_images, "its images lie directly in it", id="eval-loose-images"),
    pytest.param(lambda tmp: ["eval", tiny_tflite(tmp / "m.tflite").name, "--data", _data(tmp), "--int8-kernels",
                              "arm64"], "--int8-kernels chooses the kernels a QAT .keras model follows",
                 id="eval-int8-kernels-of-a-tflite"),
    pytest.param(_calibration_bomb, f"1 {TOO_LARGE} (huge.png)", id="calibration-decompression-bomb"),
    # LiteRT's Arm64 kernels under emulation (tests/test_arm.py: without the emulator installed)
    pytest.param(lambda tmp: ["bench", "--arm", "a77", tiny_tflite(tmp / "m.tflite").name],
                 "Unknown Arm CPU profile a77", id="arm-unknown-profile"),
    pytest.param(lambda tmp: ["bench", "--arm", "a76", "--threads", "2", tiny_tflite(tmp / "m.tflite").name],
                 "--arm counts one thread", id="arm-threads"),
    pytest.param(lambda tmp: ["bench", "--arm", "a76", "--device", "X", tiny_tflite(tmp / "m.tflite").name],
                 "does not take --device", id="arm-and-a-phone"),
    pytest.param(lambda tmp: ["bench", "--arm", "a76", "--arm-kernels", "gpu", tiny_tflite(tmp / "m.tflite").name],
                 "Unknown LiteRT kernels", id="arm-unknown-kernels"),
    pytest.param(lambda tmp: ["check", "--arm", "--arm-profiles", "a99", tiny_tflite(tmp / "m.tflite").name],
                 "Unknown Arm CPU profile a99", id="arm-check-unknown-profile"),
    pytest.param(lambda tmp: ["check", "--arm", "--arm-kernels", "xnnpack,npu", tiny_tflite(tmp / "m.tflite").name],
                 "Unknown arm-kernels npu", id="arm-check-unknown-kernels"),
    # write failures where the folder takes no file: refused before any work, even for root
    pytest.param(lambda tmp: ["convert", *SMALL, "-o", f"{special_folder()}/m.tflite"],
                 "Output folder '/proc' does not take new files: No such file or directory", id="convert-into-proc"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "-o", f"{special_folder()}/m.keras"],
                 "Output folder '/proc' does not take new files", id="finetune-into-proc"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "-o", "m.keras", "--checkpoint-dir",
                              f"{special_folder()}/ckpt"], "'/proc/ckpt' cannot be made in '/proc'",
                 id="checkpoints-into-proc"),
    pytest.param(lambda tmp: ["import-weights", "x.pth", "--model", "mobilevit_v3_xxs", "-o",
                              f"{special_folder()}/w.weights.h5"], "Output folder '/proc' does not take new files",
                 id="import-into-proc"),
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--csv", f"{special_folder()}/b.csv"],
                 "Output folder '/proc' does not take new files", id="bench-csv-into-proc"),
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--csv", _data(tmp)],
                 "is a folder where a file would be written: move it or choose another --csv",
                 id="bench-csv-onto-folder"),
    # flags that cannot work together, or inputs that are not there: refused before the model is built
    pytest.param(lambda tmp: ["convert", "--fp32", "--io", "uint8", *SMALL], "--io uint8 needs a fully-integer model",
                 id="uint8-io-of-fp32"),
    pytest.param(_calibration_folder_missing, "Image folder 'missing' does not exist", id="calibration-folder-missing"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _data(tmp), "--val-split", "0.2", "-o", "m.keras"],
                 "has val/, which validates the training; --val-split holds out part of the training images only "
                 "where there is none", id="val-split-with-val-folder"),
    # messages that name their file and delete nothing of the user's
    pytest.param(_checkpoint_folder_in_use, "Checkpoint folder 'ckpt' is in use by another edgevit run (process 4242): "
                 "wait for it to end, or pass another --checkpoint-dir.", id="checkpoint-folder-in-use"),
    pytest.param(_another_runs_checkpoint_among_the_users_files, "delete its checkpoint files (last.weights.h5, "
                 "optimizer.npz, state.json) to start fresh", id="another-runs-checkpoint-among-users-files"),
    pytest.param(_checkpoint_dir_is_a_file, "Checkpoint folder 'notes' is a file, not a folder: pass a folder.",
                 id="checkpoint-dir-is-a-file"),
    pytest.param(_keras_file_to_import, "'model.keras' is a Keras file, not a PyTorch or safetensors checkpoint",
                 id="import-a-keras-file"),
    pytest.param(_junk_keras_archive, "'junk.keras' is damaged: its config.json (the model description) is not "
                 "readable", id="junk-keras-archive"),
    pytest.param(_keras_archive_with_a_bomb("config.json"), "'bomb.keras' is not a model edgevit loads: its member "
                 "config.json would inflate from 66,", id="keras-config-bomb"),
    pytest.param(_keras_archive_with_a_bomb("model.weights.h5"), "'bomb.keras' is not a model edgevit loads: its "
                 "member model.weights.h5 would inflate from", id="keras-weights-bomb"),
    pytest.param(_keras_model_with_python_code, "Could not load 'lambda.keras': it holds Python code (such as a "
                 "Lambda layer's function), which would run as it loads; edgevit never runs it",
                 id="keras-model-with-python-code"),
    pytest.param(lambda tmp: _class_folder_named_in_latin1(tmp, "finetune"), "Class folder 'caf\\xe9' in "
                 "'data/train' cannot name a class: it is not valid UTF-8 text, which labels files are",
                 id="finetune-class-folder-not-utf8"),
    pytest.param(lambda tmp: _class_folder_named_in_latin1(tmp, "eval"), "Class folder 'caf\\xe9' in 'data/val' "
                 "cannot name a class: it is not valid UTF-8 text", id="eval-class-folder-not-utf8"),
    pytest.param(_model_with_a_class_name_that_is_not_utf8, "Class name 'caf\\udce9' cannot be a label: it is not "
                 "valid UTF-8 text", id="model-with-a-class-name-not-utf8"),
    pytest.param(_tflite_of_variable_input_size, "variable.tflite takes inputs of a size chosen at run time (shape "
                 "[1, -1, -1, 3]; -1 is variable), which a benchmark cannot choose for you", id="bench-variable-size"),
    pytest.param(lambda tmp: _tflite_with_metadata_text(tmp, b"[" * 100_000 + b"]" * 100_000, "eval"),
                 "m.tflite: its metadata contradicts the file (the embedded edgevit_metadata entry is not a readable "
                 "JSON document (it nests too deeply))", id="eval-metadata-nested-deeply"),
    pytest.param(lambda tmp: _tflite_with_metadata_text(tmp, b"[1]", "bundle"), "m.tflite: its metadata contradicts "
                 "the file (the embedded edgevit_metadata entry is a JSON list, not the object edgevit writes)",
                 id="bundle-metadata-a-list"),
    pytest.param(_bundle_with_a_sidecar_nested_deeply, "Metadata file 'm.json' is not valid JSON: it nests too deeply",
                 id="bundle-sidecar-nested-deeply"),
    pytest.param(_empty_class_folder, "has images of one class only (ants); 'bees' is empty: classification needs",
                 id="empty-class-folder"),
    pytest.param(_truncated_second_model, "b.tflite: Truncated or not a .tflite file", id="truncated-second-model"),
    pytest.param(_checkpoint_with_few_matching_names, "holds 0% of the 279 tensor names cvnets gives "
                 "mobilevit_v3_xxs (it lacks 'conv_1.block.norm.weight', for one; 'head.weight' is one of its names",
                 id="checkpoint-with-few-matching-names"),
]


# Hostile files (issue 49): a converted int8 file edited the way an attacker or a careless edit would. eval
# and bundle refuse each in one error line; `check` lists the problem (test_check_lists_...).

@functools.cache
def int8_file() -> bytes:
    """A 2-class int8 file as `edgevit convert --int8` writes it: the camera's
    bytes in (uint8), probabilities out (a closing SOFTMAX), both metadata
    entries, the labels packed; converted once per test process."""
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import ModelSpec, Preprocessing

    inputs = keras.Input((16, 16, 3))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, strides=2)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(x), name="tiny_int8")
    spec = ModelSpec("tiny_int8", "test", builder=None, default_input_size=16,
                     preprocessing=Preprocessing(16, 18, mean=(0.5,) * 3, std=(0.25,) * 3))
    with tempfile.TemporaryDirectory() as tmp:
        result = export(model, spec, ExportOptions(precision="int8", output=str(Path(tmp) / "t.tflite"),
                                                   calib_samples=4, validation_samples=2, gpu_images=0, arm_images=0,
                                                   diagnose_below_cosine=None))
        return result.files.model.read_bytes()


def _both_entries(edit):
    """The file with both metadata entries rebuilt from its edgevit document
    as ``edit`` changes it: a lie told consistently."""
    def make(content: bytes) -> bytes:
        from edgevit.litert.metadata import embed, read_embedded

        document = read_embedded(content)
        edit(document)
        return embed(hostile.flatbuffer_of(content), document, document["labels"])
    return make


def _edgevit_field(edit):
    return lambda content: hostile.with_edgevit_fields(content, edit)


def _second_entry(name: str):
    def make(content: bytes) -> bytes:
        data = hostile.entry_data(content, name)
        if name == "edgevit_metadata":
            data = json.dumps({**json.loads(data), "model": "another"}).encode()
        return hostile.with_second_entry(content, name, data)
    return make


# (how the file is edited, the problem `check` lists and eval and bundle refuse it with)
HOSTILE_METADATA = [
    pytest.param(lambda c: hostile.with_standard_data(c, hostile.shared_table_metadata(100)),
                 "TFLITE_METADATA entry is not a readable ModelMetadata flatbuffer (it references more than its "
                 "1,724 bytes can hold", id="metadata-billion-laughs"),
    pytest.param(lambda c: hostile.with_standard_data(c, hostile.standard_data(c)[:200]),
                 "not a readable ModelMetadata flatbuffer (an offset points outside its 200 bytes)",
                 id="metadata-truncated"),
    pytest.param(lambda c: hostile.with_inflating_member(c, "big.bin", 2048),
                 "the zip packed in the model holds 1 file(s) no metadata names ('big.bin')", id="zip-bomb-beside"),
    pytest.param(lambda c: hostile.with_inflating_member(c, "labels.txt", 2048),
                 "packed file labels.txt declares 2,147,483,648 bytes, beyond the 16,777,216 a packed file may take",
                 id="zip-bomb-labels"),
    pytest.param(lambda c: hostile.with_member_patched(c, "labels.txt", flags=1),
                 "packed file labels.txt is encrypted", id="zip-encrypted"),
    pytest.param(lambda c: hostile.with_member_patched(c, "labels.txt", method=99),
                 "packed file labels.txt is compressed with method 99", id="zip-method-99"),
    pytest.param(lambda c: hostile.with_member_patched(c, "labels.txt", crc=12345),
                 "packed file labels.txt fails its CRC check", id="zip-bad-crc"),
    pytest.param(lambda c: hostile.with_zip(hostile.flatbuffer_of(c), [("labels.txt", hostile.labels_member(c)),
                                                                      ("labels.txt", b"wasps\nflies\n")]),
                 "holds 2 files named labels.txt; zip readers differ in which one they take", id="zip-two-labels"),
    pytest.param(_second_entry("edgevit_metadata"), "the file has 2 edgevit_metadata entries",
                 id="two-edgevit-entries"),
    pytest.param(_second_entry("TFLITE_METADATA"), "the file has 2 TFLITE_METADATA entries",
                 id="two-standard-entries"),
    pytest.param(_edgevit_field(lambda d: d.update(num_classes="2")),
                 "edgevit metadata's num_classes is \"2\" (text), not a whole number of classes", id="classes-text"),
    pytest.param(_edgevit_field(lambda d: d.update(input="uint8")),
                 "edgevit metadata's input is \"uint8\" (text), not an object", id="input-text"),
    pytest.param(_edgevit_field(lambda d: d.update(labels=5)), "edgevit metadata's labels is 5, not a list of texts",
                 id="labels-a-number"),
    pytest.param(_edgevit_field(lambda d: d["preprocessing"].update(interpolation="evil")),
                 "preprocessing.interpolation is \"evil\" (text), not one of nearest, bilinear, bicubic",
                 id="interpolation-evil"),
    pytest.param(_edgevit_field(lambda d: d["preprocessing"].update(resize_size=0)),
                 "preprocessing.resize_size is 0, not a positive whole number of pixels", id="resize-size-0"),
    pytest.param(_edgevit_field(lambda d: d["preprocessing"].update(mean=[0.5, 0.5])),
                 "preprocessing.mean is [0.5, 0.5], not 3 numbers, one a channel", id="mean-of-two"),
    pytest.param(_edgevit_field(lambda d: d["preprocessing"].update(input_size=17)),
                 "preprocessing.input_size is 17; the graph's input is 16x16 pixels", id="input-size-17"),
    pytest.param(_both_entries(lambda d: d.update(labels=["an\0t\as", "bees"])),
                 "label 0 ('an\\x00t\\x07s') cannot be a line of a labels file: it holds control characters",
                 id="labels-with-control-bytes"),
    pytest.param(_both_entries(lambda d: d["output"].update(kind="logits")),
                 "edgevit metadata says the file outputs logits; the graph ends in a softmax", id="logits-of-softmax"),
    pytest.param(_both_entries(lambda d: d["input"].update(takes="normalised")),
                 "edgevit metadata says the input takes the normalised image, values in [-2, 2]; the graph's uint8 "
                 "input holds [0, 255]", id="normalised-of-bytes"),
    pytest.param(_both_entries(lambda d: d["output"].update(quantization={"scale": 0.5, "zero_point": 3})),
                 "edgevit metadata says the output's quantization is scale 0.5, zero point 3; the graph's is scale "
                 "0.00390625, zero point 0", id="output-quantization"),
    pytest.param(_both_entries(lambda d: d["input"].update(quantization={"scale": 0.1, "zero_point": 0})),
                 "edgevit metadata says the input's quantization is scale 0.1, zero point 0", id="input-quantization"),
    pytest.param(lambda c: hostile.with_entry(c, "edgevit_metadata", b"[1]"),
                 "the embedded edgevit_metadata entry is a JSON list, not the object edgevit writes",
                 id="edgevit-entry-a-list"),
]


def _int8_file_edited(make, command: str):
    def setup(tmp):
        (tmp / "m.tflite").write_bytes(make(int8_file()))
        if command == "eval":
            return ["eval", "m.tflite", "--data", _data(tmp)]
        demo_folder(tmp)
        return ["bundle", "m.tflite", "--android-demo", "demo"]
    return setup


def _bundle_of(tmp, sidecar=None, labels=None):
    """bundle of an edgevit file whose sidecar document is edited by
    ``sidecar(doc)`` and whose sidecar labels are ``labels`` (bytes)."""
    edgevit_tflite(tmp / "m.tflite")
    demo_folder(tmp)
    if sidecar is not None:
        document = json.loads((tmp / "m.json").read_text())
        sidecar(document)
        (tmp / "m.json").write_text(json.dumps(document))
    if labels is not None:
        (tmp / "m.labels.txt").write_bytes(labels)
    return ["bundle", "m.tflite", "--android-demo", "demo"]


def _assets_linked_out_of_the_demo(tmp):
    args = _bundle_of(tmp)
    (tmp / "elsewhere").mkdir()
    assets = tmp / "demo" / "app" / "src" / "main" / "assets"
    assets.rmdir()
    assets.symlink_to("../../../../elsewhere")
    return args


def _folder_where_the_model_asset_goes(tmp):
    args = _bundle_of(tmp)
    (tmp / "demo" / "app" / "src" / "main" / "assets" / "model.tflite").mkdir()
    (tmp / "demo" / "app" / "src" / "main" / "assets" / "model.tflite" / "notes.txt").write_text("the user's")
    return args


def _sidecar_of_a_file_without_metadata(tmp):
    args = _bundle_of(tmp)
    (tmp / "m.tflite").write_bytes(hostile.flatbuffer_of(tiny_tflite(tmp / "plain.tflite").read_bytes()))
    (tmp / "plain.tflite").unlink()
    document = json.loads((tmp / "m.json").read_text())
    document.update(num_classes=1000, labels=[f"c{i}" for i in range(1000)])
    document["output"]["shape"] = [1, 1000]
    (tmp / "m.json").write_text(json.dumps(document))
    (tmp / "m.labels.txt").unlink()
    return args


def _fifo(tmp, command: str):
    os.mkfifo(tmp / "m.tflite")
    if command == "eval":
        return ["eval", "m.tflite", "--data", _data(tmp)]
    return [command, "m.tflite", *(["--android-demo", str(demo_folder(tmp))] if command == "bundle" else [])]


def _written(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return path.name


def _link_to_itself(tmp, name: str) -> str:
    (tmp / name).symlink_to(name)
    return name


LONG_PATH = "/".join(["d" * 200] * 21) + "/m.tflite"  # 4229 bytes: beyond PATH_MAX, each name within NAME_MAX

BAD_INPUTS += [pytest.param(_int8_file_edited(p.values[0], command), p.values[1], id=f"{command}-{p.id}")
               for p in HOSTILE_METADATA for command in ("eval", "bundle")]
BAD_INPUTS += [
    # bundle writes only inside the demo folder, replaces only files, ships only metadata that agrees with the file
    pytest.param(_assets_linked_out_of_the_demo, "'demo/app/src/main/assets' is a symbolic link to ",
                 id="bundle-assets-linked-out-of-the-demo"),
    pytest.param(_folder_where_the_model_asset_goes, "'demo/app/src/main/assets/model.tflite' is a folder where bundle "
                 "writes the app's model.tflite", id="bundle-folder-where-an-asset-goes"),
    pytest.param(lambda tmp: _bundle_of(tmp, sidecar=lambda d: d.update(model="other")), "m.json differs from the "
                 "metadata embedded in m.tflite (model: \"other\" where the file says \"plain\")",
                 id="bundle-sidecar-names-another-model"),
    pytest.param(lambda tmp: _bundle_of(tmp, sidecar=lambda d: d.update(precision="int8")),
                 "(precision: \"int8\" where the file says \"fp32\")", id="bundle-sidecar-says-int8"),
    pytest.param(lambda tmp: _bundle_of(tmp, sidecar=lambda d: d["input"].update(takes="rgb_bytes")),
                 "(input.takes: \"rgb_bytes\" where the file says \"normalised\")", id="bundle-sidecar-says-bytes"),
    pytest.param(lambda tmp: _bundle_of(tmp, labels=b"wasps\nflies\n"), "m.labels.txt line 1 is 'wasps' where the "
                 "model's metadata says 'ants'", id="bundle-sidecar-labels-of-another-model"),
    pytest.param(lambda tmp: _bundle_of(tmp, labels=b"ants\nbees\nwasps\n"), "m.labels.txt has 3 labels; the "
                 "model's metadata has 2", id="bundle-sidecar-labels-one-too-many"),
    pytest.param(lambda tmp: _bundle_of(tmp, labels=b"caf\xe9\nbees\n"), "Labels file 'm.labels.txt' is not UTF-8 "
                 "text (byte 3)", id="bundle-sidecar-labels-not-utf8"),
    pytest.param(_sidecar_of_a_file_without_metadata, "m.json contradicts m.tflite (edgevit metadata says the output "
                 "is float32 [1, 1000]; the graph's is float32 [1, 2]", id="bundle-sidecar-contradicts-the-graph"),
    # a model path that is no regular file: a FIFO would block, /dev/zero never ends
    *[pytest.param(lambda tmp, c=command: _fifo(tmp, c), "Model file 'm.tflite' is a FIFO (a named pipe), not a "
                   "file.", id=f"{command}-fifo") for command in ("check", "bench", "eval", "bundle")],
    pytest.param(lambda tmp: ["check", "/dev/zero"], "Model file '/dev/zero' is a device, not a file.",
                 id="check-dev-zero"),
    pytest.param(lambda tmp: ["check", _written(tmp / "m.tflite", hostile.shared_subgraph_model(1000))],
                 "m.tflite: Damaged .tflite file: it references more than its 8,084 bytes can hold",
                 id="check-graph-billion-laughs"),
    pytest.param(lambda tmp: ["eval", _link_to_itself(tmp, "m.tflite"), "--data", _data(tmp)], "Model file "
                 "'m.tflite' is a symbolic link that loops", id="eval-model-link-loop"),
    pytest.param(lambda tmp: ["eval", edgevit_tflite(tmp / "m.tflite").name, "--data", _link_to_itself(tmp, "data")],
                 "Invalid value for '--data': 'data' is a symbolic link that loops", id="eval-data-link-loop"),
    pytest.param(lambda tmp: ["finetune", *SMALL, "--data", _link_to_itself(tmp, "data"), "-o", "m.keras"],
                 "Invalid value for '--data': 'data' is a symbolic link that loops", id="finetune-data-link-loop"),
    pytest.param(lambda tmp: ["convert", "--int8", *SMALL, "--calib", _link_to_itself(tmp, "calib")],
                 "Image folder 'calib' is a symbolic link that loops", id="calibration-folder-link-loop"),
    # numbers that are no time
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--timeout", "nan"],
                 "Invalid value for '--timeout': 'nan' is not a number of seconds", id="bench-timeout-nan"),
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--max-secs", "nan"],
                 "Invalid value for '--max-secs': 'nan' is not a number of seconds", id="bench-max-secs-nan"),
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--max-secs", "inf"],
                 "Invalid value for '--max-secs': 'inf' is not a number of seconds", id="bench-max-secs-inf"),
    # output paths the system cannot take, or that break the commands that name them
    pytest.param(lambda tmp: ["convert", *SMALL, "-o", LONG_PATH], "bytes long with its folder; this system takes "
                 "paths of up to 4,095: choose a shorter -o.", id="convert-output-beyond-path-max"),
    pytest.param(lambda tmp: ["bench", tiny_tflite(tmp / "m.tflite").name, "--csv", LONG_PATH + ".csv"],
                 "choose a shorter --csv.", id="bench-csv-beyond-path-max"),
    pytest.param(lambda tmp: ["convert", *SMALL, "-o", "a\nb.tflite"], "Output name 'a\\nb.tflite' holds a control "
                 "character: choose another -o.", id="convert-output-name-with-a-line-break"),
]


@pytest.mark.parametrize("setup, message", BAD_INPUTS)
def test_bad_input_is_one_error_line_and_changes_nothing(tmp_path, monkeypatch, setup, message):
    one_error_line_and_nothing_changed(tmp_path, monkeypatch, setup, message)


def one_error_line_and_nothing_changed(tmp_path, monkeypatch, setup, message):
    """The command ``setup(tmp_path)`` returns, run in ``tmp_path``: exit 1,
    one `error:` line holding ``message``, no file changed."""
    monkeypatch.chdir(tmp_path)
    args = setup(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = run(*args)
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("make, problem", HOSTILE_METADATA)
def test_check_lists_what_is_wrong_with_a_files_metadata(tmp_path, make, problem):
    """`check` reads the file whatever its metadata holds, and says what is wrong."""
    path = tmp_path / "m.tflite"
    path.write_bytes(make(int8_file()))
    code, out, err = run("check", path, "--nnapi", "--json")
    assert code == 0, err
    problems = json.loads(out)["metadata"]["problems"]
    assert any(problem.lower() in p.lower() for p in problems), problems


# What a bomb may cost `check` in a process of its own: its time, and an address-space limit far below what
# the bombs cost before (a 1.7 KB billion laughs: more than 6.8 GB and 125 s unfinished; a 2.1 MB zip: 6.3 GB).
BOMB_SECONDS, BOMB_ADDRESS_SPACE = 20, 1 << 30


@pytest.mark.parametrize("make, problem", [
    (lambda c: hostile.with_standard_data(c, hostile.shared_table_metadata(2900)), "references more than its 46,"),
    (lambda c: hostile.with_inflating_member(c, "big.bin", 2048), "holds 1 file(s) no metadata names ('big.bin')"),
    (lambda c: hostile.with_inflating_member(c, "labels.txt", 2048), "declares 2,147,483,648 bytes"),
], ids=["billion-laughs-36-kb", "zip-member-of-2-gib", "zip-labels-of-2-gib"])
def test_a_bomb_in_a_small_file_costs_check_seconds_and_bounded_memory(tmp_path, make, problem):
    (tmp_path / "m.tflite").write_bytes(make(int8_file()))
    start = time.monotonic()
    proc = edgevit_process("check", str(tmp_path / "m.tflite"), "--nnapi", "--json",
                           limit_address_space=BOMB_ADDRESS_SPACE)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < BOMB_SECONDS
    assert any(problem in p for p in json.loads(proc.stdout)["metadata"]["problems"])


def test_a_graph_that_shares_its_tables_costs_check_seconds_and_bounded_memory(tmp_path):
    """An 8 KB file whose 1000 subgraphs are one subgraph of 1000 shared
    tensors kept `check` unpacking for more than 120 s (843 MB when killed)."""
    (tmp_path / "m.tflite").write_bytes(hostile.shared_subgraph_model(1000))
    start = time.monotonic()
    proc = edgevit_process("check", str(tmp_path / "m.tflite"), limit_address_space=BOMB_ADDRESS_SPACE)
    assert time.monotonic() - start < BOMB_SECONDS
    assert proc.returncode == 1 and "references more than its 8,084 bytes can hold" in proc.stderr, proc.stderr


def test_a_metadata_entry_beyond_its_size_cap_is_refused_unread(tmp_path, monkeypatch):
    """A 200 MB edgevit entry kept `check` busy for minutes; beyond 16 MiB an
    entry is refused by its declared size (here the cap is made small)."""
    from edgevit.litert import flatbuffer

    path = edgevit_tflite(tmp_path / "m.tflite")
    monkeypatch.setattr(flatbuffer, "MAX_METADATA_BYTES", 100)
    code, out, err = run("check", path, "--nnapi", "--json")
    assert code == 0, err
    assert re.fullmatch(r"the edgevit_metadata entry is [0-9,]+ bytes, beyond the 100 a metadata entry may take",
                        json.loads(out)["metadata"]["problems"][0])
    code, _, err = run("eval", path, "--data", _data(tmp_path))
    assert code == 1 and err.count("error:") == 1 and "beyond the 100 a metadata entry may take" in err, err


def test_a_run_killed_outright_leaves_no_staging_file_that_later_runs_keep(tmp_path):
    """SIGKILL mid-convert left .edgevit-*/NAME.tflite beside the output for
    good; the next run that stages there removes what a dead process left."""
    stage = textwrap.dedent("""\
        import os, sys
        from pathlib import Path
        from edgevit.writing import staged
        out = Path(sys.argv[1])
        with staged([out]) as staging:
            staging.write_bytes(out, b"half a model")
            if sys.argv[2] == "kill":
                os.kill(os.getpid(), 9)
    """)
    out = tmp_path / "m.tflite"
    killed = subprocess.run([sys.executable, "-c", stage, str(out), "kill"], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    left = list(tmp_path.glob(".edgevit-*"))
    assert [p.name for p in left[0].iterdir()] == ["m.tflite"] and not out.exists()
    running = tmp_path / f".edgevit-{os.getpid()}-of-a-running-process"  # this test's own: kept
    running.mkdir()
    os.utime(running, (time.time() - 3600, time.time() - 3600))
    (tmp_path / ".edgevit-android-demo").write_text("")  # not a staging folder's name: kept
    again = subprocess.run([sys.executable, "-c", stage, str(out), "finish"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".edgevit-android-demo", running.name, "m.tflite"])
    assert out.read_bytes() == b"half a model"


def test_qat_under_an_address_space_limit_ends_in_an_out_of_memory_line(tmp_path):
    """`edgevit qat` under `ulimit -v 3100000` died of SIGSEGV mid-epoch, or
    printed MemoryError's line and then hung in TensorFlow at exit."""
    data = image_folder(tmp_path / "data", per_class=4)
    proc = edgevit_process("qat", *SMALL, "--data", str(data), "--epochs", "1", "--batch-size", "8",
                           "--calib-batches", "1", "-o", str(tmp_path / "q.keras"),
                           limit_address_space=3_100_000 * 1024)
    assert proc.returncode == 1, proc.stderr
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("error: Out of memory in the quantization-aware training stage: this shell limits a "
                            "process to 3100000 KiB of address space (`ulimit -v`), "), proc.stderr
    # neither a smaller batch nor a smaller model can help: TensorFlow's part is more than the limit leaves
    assert error.endswith("raise the limit (`ulimit -v unlimited`) (TensorFlow's part of the stage alone takes about "
                          "2.20 GB, whatever the model and batch)."), error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_stage_beyond_the_address_space_left_is_refused_before_it_runs(monkeypatch):
    from edgevit import memory

    monkeypatch.setattr(memory, "address_space_left", lambda: (3_100_000 * 1024, 200_000_000))
    with pytest.raises(EdgevitError, match=r"^Out of memory in the training stage: this shell limits a process to "
                                           r"3100000 KiB of address space \(`ulimit -v`\), 0.2 GB of it is left, and "
                                           r"the stage needs about 1.1 GB: raise the limit"):
        with memory.memory_of("training", tiny_classifier(), 8):
            raise AssertionError("the stage ran")


def test_what_a_file_or_folder_names_reaches_the_terminal_as_text(capsys):
    """Control bytes (NUL, BEL, ESC) and rich markup in names print as
    escapes and text; a bracket tag like "[/x]" ended in a MarkupError."""
    from edgevit.cli.output import log, print_table

    print_table("per class", ["class", "images"], [["an\0t\as", 1], ["[/x]\x1b[31m", 2]])
    log("warning: 1 file skipped in caf\x07")
    out, err = capsys.readouterr()
    assert "an\\x00t\\x07s" in out and "[/x]\\x1b[31m" in out and "\a" not in out and "\x1b[31m" not in out
    assert err == "warning: 1 file skipped in caf\\x07\n"


def test_commands_to_copy_keep_a_path_one_word_that_is_no_option():
    from edgevit.errors import shell_word
    from edgevit.export.android_bundle import build_commands

    assert shell_word("-demo") == "./-demo" and shell_word("my model.tflite") == "'my model.tflite'"
    assert build_commands("-demo")[0] == "cd ./-demo"


def test_help_documents_the_exit_codes():
    code, out, _ = run("--help")
    assert code == 0
    for status in ("0 ", "1 ", "2-5", "130", "143"):
        assert f"    {status}" in out, out


@pytest.mark.parametrize("kind", ["grayscale", "16-bit", "cmyk", "palette-transparency", "alpha", "exif-rotated",
                                  "1-bit"])
def test_unusual_images_are_read_as_the_app_reads_them(tmp_path, kind):
    path = tmp_path / "image.png"
    expected_size, expected = (12, 8), (128, 128, 128)
    if kind == "grayscale":
        Image.new("L", (12, 8), 128).save(path)
    elif kind == "16-bit":
        # 32896 = 128 * 257: half scale in 16 bits (convert("RGB") alone makes it white)
        Image.fromarray(np.full((8, 12), 32896, np.uint16)).save(path)
        assert Image.open(path).mode.startswith("I")
    elif kind == "cmyk":
        path = tmp_path / "image.jpg"
        Image.new("CMYK", (12, 8), (0, 0, 0, 127)).save(path, quality=100)
    elif kind == "palette-transparency":
        img = Image.new("P", (12, 8), 1)
        img.putpalette([0, 0, 0, 128, 128, 128] + [0] * 762)
        img.info["transparency"] = 0
        img.save(path, transparency=0)
    elif kind == "alpha":
        Image.new("RGBA", (12, 8), (128, 128, 128, 0)).save(path)  # colours as stored, alpha dropped
    elif kind == "exif-rotated":
        # stored 12x8 with the left half red; orientation 6 shows it turned 90 degrees clockwise
        pixels = np.zeros((8, 12, 3), np.uint8)
        pixels[:, :6] = (255, 0, 0)
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(pixels).save(path, exif=exif)
        expected_size, expected = (8, 12), (255, 0, 0)
    elif kind == "1-bit":
        Image.new("1", (12, 8), 1).save(path)
        expected = (255, 255, 255)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        img = open_rgb(path)
    assert img.mode == "RGB" and img.size == expected_size
    top_left = np.asarray(img)[0, 0].astype(int)
    assert np.abs(top_left - expected).max() <= 2, (kind, top_left)


def test_unreadable_images_are_skipped_and_counted_by_reason(tmp_path):
    from edgevit.data.decode import NOT_OPENED
    from edgevit.data.folders import Split
    from edgevit.data.stream import ImageStream
    from edgevit.registry import Preprocessing

    Image.new("RGB", (16, 16), (10, 20, 30)).save(tmp_path / "good.png")
    png_claiming(tmp_path / "huge.png", 15000, 15000)
    (tmp_path / "garbage.jpg").write_bytes(b"not a jpeg")
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "float.tif")
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "removed.jpg")
    files = sorted(str(p) for p in tmp_path.iterdir())
    stream = ImageStream(Split(files, np.arange(len(files))), Preprocessing(8, 8))
    images, labels = stream.read_all(8)
    assert images.shape == (1, 8, 8, 3) and labels.tolist() == [files.index(str(tmp_path / "good.png"))]
    skipped = stream.tally
    assert skipped.counts() == {FLOAT_PIXELS: 1, NOT_AN_IMAGE: 1, TOO_LARGE: 1, NOT_OPENED: 1}
    assert "4 unreadable image(s) skipped" in skipped.summary() and "huge.png" in skipped.summary()


@pytest.fixture
def ants_and_bees_model(tmp_path):
    from edgevit import create_model
    from edgevit.saving import save_model, set_class_names

    model = create_model("mobilevit_v3_xxs", num_classes=2, input_size=64)
    set_class_names(model, ["ants", "bees"])
    return save_model(model, tmp_path / "m.keras")


def test_eval_scores_every_image_of_its_folder_and_says_how_many(tmp_path, ants_and_bees_model):
    from edgevit.evaluate import evaluate

    flat = image_folder(tmp_path / "flat", per_class=3, splits=("",))
    png_claiming(flat / "bees" / "huge.png", 15000, 15000)
    code, out, err = run("eval", ants_and_bees_model, "--data", flat, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["images"], report["found"], report["split"]) == (6, 7, "every image")
    assert report["skipped_reasons"] == {TOO_LARGE: 1}
    assert {c: v["images"] for c, v in report["per_class"].items()} == {"ants": 3, "bees": 3}
    # a folder holding only val/<class> is scored whole; class folders match the model's classes by name
    only_val = image_folder(tmp_path / "only_val", classes=("bees",), per_class=2, splits=("val",))
    report = evaluate(str(ants_and_bees_model), str(only_val))
    assert (report["images"], report["split"], list(report["per_class"])) == (2, "val/", ["bees"])
    others = image_folder(tmp_path / "others", classes=("cats", "dogs"), splits=("",))
    with pytest.raises(EdgevitError, match="class folders that are not classes of mobilevit_v3_xxs: cats, dogs"):
        evaluate(str(ants_and_bees_model), str(others))


def test_class_names_travel_from_finetune_into_the_converted_labels(tmp_path, monkeypatch):
    from edgevit.litert.metadata import read_embedded

    monkeypatch.chdir(tmp_path)
    data = image_folder(tmp_path / "data", per_class=4)
    code, _, err = run("finetune", *SMALL, "--data", data, "--epochs", "1", "--batch-size", "8", "-o", "m.keras")
    assert code == 0, err
    assert not (tmp_path / "m.keras.ckpt").exists()  # removed once the model is saved
    code, _, err = run("convert", "--fp32", "m.keras", "--no-arm-run", "--no-gpu-run")  # named after m.keras
    assert code == 0, err
    assert (tmp_path / "m_fp32.labels.txt").read_text() == "ants\nbees\n"
    assert json.loads((tmp_path / "m_fp32.json").read_text())["labels"] == ["ants", "bees"]
    assert read_embedded((tmp_path / "m_fp32.tflite").read_bytes())["labels"] == ["ants", "bees"]
    code, _, err = run("convert", "--fp32", "m.keras")
    assert code == 1 and "m_fp32.tflite, m_fp32.json, m_fp32.labels.txt and m_fp32.report.json already exist: " \
                         "pass --overwrite to replace them" in err, err


def test_sigterm_during_validation_removes_the_staging_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.report.json").write_text("{}")  # an earlier run's report stays as it was
    before = snapshot(tmp_path)

    def terminated_while_validating(*args, **kwargs):
        assert list(tmp_path.glob(".edgevit-*")), "validation runs on the staged file"
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises before this ends
        raise AssertionError("SIGTERM did not interrupt the export")

    monkeypatch.setattr(pipeline, "validate", terminated_while_validating)
    code, _, err = run("convert", "--fp32", *SMALL, "--num-classes", "2", "-o", "m.tflite", "--overwrite")
    assert code == 143 and err.strip().endswith("terminated"), err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("failure", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_failed_replace_puts_the_previous_files_back(tmp_path, monkeypatch, failure):
    finals = [tmp_path / name for name in ("a.tflite", "a.json", "a.labels.txt", "a.report.json")]
    staging = tmp_path / ".edgevit-staging"
    staging.mkdir()
    for final in finals:
        final.write_text("old " + final.name)
        (staging / final.name).write_text("new " + final.name)
    real_replace = os.replace

    def replace_failing_on_the_labels(src, dst):
        if Path(src) == staging / "a.labels.txt":  # placing the new labels
            raise failure
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_failing_on_the_labels)
    with pytest.raises(EdgevitError if isinstance(failure, OSError) else KeyboardInterrupt):
        replace_all([(staging / final.name, final) for final in finals])
    assert [final.read_text() for final in finals] == ["old " + final.name for final in finals]


def test_relative_benchmark_binary_runs_that_file(tmp_path, monkeypatch):
    """`--benchmark-binary ./bm` runs ./bm, not a `bm` looked up on PATH."""
    import profile_samples

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample.txt").write_text(profile_samples.CPU_RUN)
    script = tmp_path / "bm"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable} -S
        import sys
        sys.stdout.write(open({str(tmp_path / "sample.txt")!r}).read())
    """))
    script.chmod(0o755)
    model = tiny_tflite(tmp_path / "plain.tflite")
    code, out, err = run("bench", model.name, "--threads", "1", "--host-kernels", "xnnpack", "--runs", "1",
                         "--warmup", "0", "--benchmark-binary", "./bm", "--json")
    assert code == 0, err
    row = next(r for r in json.loads(out)["results"] if r["runtime"] == "benchmark_model")
    assert row["status"] == "ok", row


# Write failures half-way (a file-size limit fails a write as a full disk does): one error line naming the
# file and the cause, the files that were there before as they were, no staging or partial file.

def _bench_plot_over_the_limit(tmp):
    tiny_tflite(tmp / "m.tflite")
    return ["bench", "m.tflite", "--threads", "1", "--runs", "1", "--host-kernels", "xnnpack",
            "--csv", "b.csv", "--plot", "b.png"], "'b.png'", 2000  # the CSV fits the limit, the plot does not


def _bundle_over_the_limit(tmp):
    edgevit_tflite(tmp / "m.tflite")
    (demo_folder(tmp) / "app" / "src" / "main" / "assets" / "labels.txt").write_text("an earlier model's\n")
    return ["bundle", "m.tflite", "--android-demo", "demo"], "demo/app/src/main/assets/model.tflite'", 500


def _convert_over_the_limit(tmp):
    (tmp / "m.report.json").write_text("{}")  # from an earlier run: stays as it was
    return ["convert", "--fp32", *SMALL, "--num-classes", "2", "-o", "m.tflite", "--no-gpu-run", "--overwrite"], \
        "'m.tflite'", 2000


@pytest.mark.parametrize("setup", [_bench_plot_over_the_limit, _bundle_over_the_limit, _convert_over_the_limit],
                         ids=["bench", "bundle", "convert"])
def test_a_write_over_the_file_size_limit_is_one_error_and_leaves_nothing(tmp_path, monkeypatch, setup):
    monkeypatch.chdir(tmp_path)
    args, failed_file, limit = setup(tmp_path)
    before = snapshot(tmp_path)
    with file_size_limit(limit):
        code, _, err = run(*args)
    assert code == 1, err
    error = err.splitlines()[-1]
    assert error.startswith("error: Could not write ") and failed_file in error, err
    assert "File too large: it exceeds the file-size limit of this shell (`ulimit -f`)" in error, err
    assert "Traceback" not in err and snapshot(tmp_path) == before


def test_eval_of_a_tflite_file_streams_its_images_and_writes_no_file_of_them(tmp_path, monkeypatch):
    """eval wrote every image to a temporary inputs.npy for LiteRT's child
    (15.7 GB for 20,000 images at 256 px); now it hands them over a batch
    at a time: under a 2000-byte file-size limit it scores every image."""
    monkeypatch.chdir(tmp_path)
    edgevit_tflite(tmp_path / "m.tflite")
    data = _data(tmp_path, per_class=20)
    before = snapshot(tmp_path)
    with file_size_limit(2000):
        code, out, err = run("eval", "m.tflite", "--data", data, "--json")
    assert code == 0, err
    assert json.loads(out)["images"] == 40 and snapshot(tmp_path) == before


def test_a_litert_child_that_fails_while_fed_batches_is_one_error(tmp_path):
    from edgevit.litert.run_model import StreamedRun

    (tmp_path / "bad.tflite").write_bytes(b"not a flatbuffer")
    with pytest.raises(EdgevitError, match=r"^LiteRT failed running bad.tflite: exit status 1"):
        with StreamedRun(tmp_path / "bad.tflite") as run:
            run(np.zeros((2, 8, 8, 3), np.float32))


def test_model_and_weights_files_over_the_file_size_limit_leave_nothing(tmp_path):
    from edgevit.converters.checkpoints import save_weights_atomic

    from edgevit.saving import save_model

    model = tiny_classifier()
    (tmp_path / "m.keras").write_text("an earlier model")
    before = snapshot(tmp_path)
    for save, name in ((save_model, "m.keras"), (save_weights_atomic, "w.weights.h5")):
        with file_size_limit(2000), pytest.raises(EdgevitError, match=f"Could not write '.*{name}': File too large"):
            save(model, tmp_path / name)
        assert snapshot(tmp_path) == before


def tiny_classifier(size: int = 16):
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(8, 3, name="conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(x), name="tiny")


@pytest.mark.parametrize("failure", ["file-size limit", "Ctrl-C"])
def test_a_failed_or_interrupted_checkpoint_save_keeps_the_last_checkpoint_whole(tmp_path, monkeypatch, failure):
    """h5py under a file-size limit printed a traceback per open object, then
    crashed the process; Ctrl-C left last.partial.weights.h5 behind."""
    from edgevit.train import checkpoints
    from edgevit.train.loop import TrainConfig, Trainer

    folder = tmp_path / "ckpt"
    trainer = Trainer(tiny_classifier(), None, 16, TrainConfig(checkpoint_dir=str(folder)), log=lambda m: None)
    trainer.save_checkpoint(1)
    before = snapshot(tmp_path)
    if failure == "Ctrl-C":
        def interrupted(model):
            raise KeyboardInterrupt

        monkeypatch.setattr(checkpoints, "weights_h5", interrupted)  # checkpoints write the files now
        with pytest.raises(KeyboardInterrupt):
            trainer.save_checkpoint(2)
        monkeypatch.undo()
    else:
        with file_size_limit(2000), pytest.raises(EdgevitError, match="Could not write '.*last.weights.h5': File too"):
            trainer.save_checkpoint(2)
    assert snapshot(tmp_path) == before
    assert json.loads((folder / "state.json").read_text())["epochs_done"] == 1
    # the first save of a run: nothing of it is left, not even the folder it made
    other = tmp_path / "other"
    with file_size_limit(2000), pytest.raises(EdgevitError):
        Trainer(tiny_classifier(), None, 16, TrainConfig(checkpoint_dir=str(other)),
                log=lambda m: None).save_checkpoint(1)
    assert not other.exists()


def test_a_checkpoint_folder_is_held_by_one_run_at_a_time(tmp_path):
    from edgevit.train.checkpoints import LOCK_FILE, checkpoint_lock

    folder = tmp_path / "ckpt"
    with checkpoint_lock(folder):
        assert (folder / LOCK_FILE).read_text() == str(os.getpid())
        with pytest.raises(EdgevitError, match=rf"is in use by another edgevit run \(process {os.getpid()}\)"):
            with checkpoint_lock(folder):
                pass
        assert (folder / LOCK_FILE).exists()  # the refused run leaves the holder's lock alone
    assert not folder.exists()  # made for the run, removed after it
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")
    with checkpoint_lock(folder):
        pass
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("tf_config, reason", [("garbage", "Expecting value"),
                                               ("[1]", "a JSON object with cluster and task is expected")])
def test_a_tf_config_that_describes_no_cluster_is_one_error_line(monkeypatch, tf_config, reason):
    """finetune and qat ended in a JSONDecodeError traceback, or trained
    outside the strategy's scope and crashed in TensorFlow."""
    from edgevit.train.distribute import strategy_for_environment

    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(EdgevitError, match=rf"^TF_CONFIG does not describe a cluster this process is part of "
                                           rf"\({re.escape(reason)}.*\): fix it, or unset it to train on this "
                                           rf"machine alone.$"):
        strategy_for_environment()


def test_a_failed_write_to_standard_output_is_one_error_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "edgevit", "--version"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == "error: Could not write to standard output: No space left on device.\n"


def test_wide_and_tall_images_decode_in_bounded_memory(tmp_path):
    """Resizing a 20000x1 PNG's shorter side to 288 px first would make a
    5.8 M x 288 image (5 GB); under a 1 GiB address-space limit it decodes."""
    Image.new("RGB", (20000, 1), (200, 10, 10)).save(tmp_path / "wide.png")
    Image.new("RGB", (1, 20000), (10, 200, 10)).save(tmp_path / "tall.png")
    script = textwrap.dedent(f"""\
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        import numpy as np
        from edgevit.data.images import load_images
        from edgevit.registry import Preprocessing
        from edgevit.data.transforms import transform
        files = [{str(tmp_path / "wide.png")!r}, {str(tmp_path / "tall.png")!r}]
        pre = Preprocessing(288, 288, "bicubic")
        images = np.stack([transform(pre)(f)[0] for f in files])  # validation, eval
        crops = np.stack([transform(pre, is_training=True)(f, 0, [0.5] * 4)[0] for f in files])  # finetune, qat
        batch, used = load_images(files, Preprocessing(256, 288, "bilinear"))  # calibration
        print(images.shape, batch.shape, int(np.abs(crops.astype(int) - images).max()),
              images[0, 0, 0].tolist(), images[1, 0, 0].tolist())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(2,", "288,", "288,", "3)", "(2,", "256,", "256,", "3)", "0",
                                   "[200,", "10,", "10]", "[10,", "200,", "10]"]


def test_a_resize_of_an_ordinary_image_is_the_reference_transform():
    """Up to MAX_RESIZED_SIDES the whole image is resized then cropped; the
    cropped-part resize used beyond gives the same pixels within 1."""
    from edgevit.data import transforms

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 600, 3)).astype(np.uint8))  # 20:1
    whole = np.asarray(img.resize((1440, 72), Image.Resampling.BILINEAR)).astype(int)[4:68, 688:752]
    np.testing.assert_allclose(np.asarray(transforms.center_crop(img, 72, 64, "bilinear")), whole, atol=1)
    ordinary = img.crop((0, 0, 40, 30))
    expected = np.asarray(ordinary.resize((96, 72), Image.Resampling.BILINEAR))[4:68, 16:80]
    np.testing.assert_array_equal(np.asarray(transforms.center_crop(ordinary, 72, 64, "bilinear")), expected)


def test_a_skipped_file_warning_is_one_line_without_python_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "notes.txt").write_text("not an image")
    (tmp_path / "calib" / "broken.jpg").write_bytes(b"not a jpeg")
    code, _, err = run("convert", "--int8", *SMALL, "--calib", "calib", "-o", "m.tflite")
    assert code == 1
    lines = [line for line in err.splitlines() if not line.startswith(">")]
    assert lines == ["warning: 1 non-image file(s) in calib skipped",
                     f"error: None of the 1 images could be read: 1 unreadable image(s) skipped: 1 {NOT_AN_IMAGE} "
                     "(broken.jpg)."], err


# bench measures what it was asked to, or says what it left out.

def test_more_threads_than_cores_are_left_out_and_said_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    tiny_tflite(tmp_path / "m.tflite")
    code, _, err = run("bench", "m.tflite", "--threads", "4", "--runs", "1")
    assert code == 1 and err.strip() == ("error: --threads 4: this machine has 2 cores, and more threads than cores "
                                         "measure how the cores are shared, not the model: ask for at most 2."), err
    code, out, err = run("bench", "m.tflite", "--threads", "1,4", "--runs", "1", "--host-kernels", "xnnpack",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["options"]["threads"] == [1, 4] and result["host"]["threads"] == [1]
    assert [r["threads"] for r in result["results"]] == [1]
    assert result["warnings"] == ["this machine has 2 cores: 4 thread(s) left out of its runs (it measures 1)"]
    assert "warning: this machine has 2 cores: 4 thread(s) left out" in err
    # asked for nothing: the default counts up to the cores, without a word
    code, out, err = run("bench", "m.tflite", "--runs", "1", "--host-kernels", "xnnpack", "--json")
    assert code == 0 and "warning" not in err, err
    result = json.loads(out)
    assert result["host"]["threads"] == [1, 2] and result["warnings"] == []


# A QAT model's files say where their ranges came from.

@pytest.fixture(scope="module")
def qat_model(tmp_path_factory):
    """A QAT mobilevit_v3_xxs (32 px, ants and bees) with ranges calibrated
    on sample photos, saved in a folder beside 8 images for --calib."""
    from edgevit import create_model
    from edgevit.data.sample_photos import sample_batch
    from edgevit.quantize.qat import quantize_model
    from edgevit.registry import get_spec
    from edgevit.saving import save_model, set_class_names

    folder = tmp_path_factory.mktemp("qat")
    model = create_model("mobilevit_v3_xxs", num_classes=2, input_size=32)
    qat = quantize_model(model, sample_batch(get_spec("mobilevit_v3_xxs").preprocessing_at(32), 8), batch_size=8)
    set_class_names(qat, ["ants", "bees"])
    save_model(qat, folder / "qat.keras")
    image_folder(folder / "calib", per_class=4, splits=("",))
    return qat, folder


def test_a_qat_models_int8_file_says_its_ranges_were_trained(qat_model, tmp_path, capfd):
    _, folder = qat_model
    code, out, err = run("convert", "--int8", folder / "qat.keras", "--calib", folder / "calib", "--no-gpu-run",
                         "-o", tmp_path / "q.tflite")
    assert code == 0, err
    report = json.loads((tmp_path / "q.report.json").read_text())
    assert report["quantization_ranges"] == "trained"
    assert report["images"] == {"calibration": None, "validation": f"8 images of {folder / 'calib'}"}
    progress = " ".join(capfd.readouterr().err.split())  # progress lines go to file descriptor 2
    assert f"{folder / 'qat.keras'} is a QAT model: its trained ranges quantize the file, and the images " \
           f"of {folder / 'calib'} only validate it" in progress
    assert json.loads((tmp_path / "q.json").read_text())["quantization_ranges"] == "trained"


def test_a_qat_models_float_file_has_no_fake_quantization(qat_model, tmp_path):
    """It was labelled fp32 while it held a QUANTIZE and a DEQUANTIZE per
    quantizer, and departed from the Keras model (min cosine 0.82)."""
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import get_spec

    qat, folder = qat_model
    result = export(qat, get_spec("mobilevit_v3_xxs"), ExportOptions(
        precision="fp32", calib_dir=str(folder / "calib"), output=str(tmp_path / "q.tflite"), gpu_images=0))
    assert result.quantization_ranges == "removed"
    assert not {"QUANTIZE", "DEQUANTIZE"} & set(result.op_histogram)
    assert result.agreement["cosine_min"] > 0.9999  # against the QAT model computing in float
    assert json.loads((tmp_path / "q.json").read_text())["quantization_ranges"] == "removed"


def test_a_qat_model_does_not_convert_to_int16x8(qat_model, tmp_path):
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import get_spec

    qat, folder = qat_model
    with pytest.raises(EdgevitError, match=r"^qat.keras is a quantization-aware \(QAT\) model: its trained ranges "
                                           r"are int8 ranges. Convert it with --int8 or --int8-mixed"):
        export(qat, get_spec("mobilevit_v3_xxs"), ExportOptions(precision="int16x8", weights_label="qat.keras",
                                                                output=str(tmp_path / "q.tflite")))
    assert snapshot(tmp_path) == {}


def test_a_model_description_beyond_its_size_cap_is_refused_unread(tmp_path, monkeypatch):
    import zipfile

    from edgevit import saving

    monkeypatch.setattr(saving, "MAX_DESCRIPTION_BYTES", 1000)
    with zipfile.ZipFile(tmp_path / "big.keras", "w") as archive:
        archive.writestr("config.json", json.dumps({"padding": "x" * 2000}))
    monkeypatch.setattr(zipfile.ZipFile, "read", None)  # never read
    with pytest.raises(EdgevitError, match=r"big.keras' is not a model edgevit loads: its config.json is 2,015 "
                                           r"bytes, beyond the 1,000 that a model description may take.$"):
        saving.check_model_file(tmp_path / "big.keras")


def test_a_saved_model_loads_without_writing_anywhere(tmp_path, monkeypatch):
    """Class names live in the archive's metadata.json: an edgevit.json member
    of their own made Keras unpack the whole archive into TMPDIR on every
    load (and leave it there when TMPDIR was full). Such files still load."""
    import zipfile

    from edgevit.saving import load_model, save_model, set_class_names

    model = tiny_classifier()
    model.name = "mobilevit_v3_xxs"  # load_model wants a registered name; the classes are what matters here
    set_class_names(model, ["ants", "bees"])
    save_model(model, tmp_path / "m.keras")
    assert sorted(zipfile.ZipFile(tmp_path / "m.keras").namelist()) == ["config.json", "metadata.json",
                                                                        "model.weights.h5"]
    earlier = tmp_path / "earlier.keras"
    with zipfile.ZipFile(tmp_path / "m.keras") as source, zipfile.ZipFile(earlier, "w") as target:
        for info in source.infolist():
            target.writestr(info, source.read(info))
        target.writestr("edgevit.json", json.dumps({"class_names": ["cats", "dogs"]}))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert load_model(tmp_path / "m.keras").edgevit_class_names == ("ants", "bees")
    assert list(scratch.iterdir()) == []
    assert load_model(earlier).edgevit_class_names == ("cats", "dogs")


# Metadata that contradicts the file (issue 38, case 1; issue 36): a plain 3-op float model whose embedded
# edgevit metadata claims mobilevit_v3_xs, int8, 1000 classes; and a file whose two metadata entries
# disagree. `bench` and `check` flag them, `eval` and `bundle` refuse them in one error line.

def lying_tflite(path: Path) -> Path:
    from edgevit.litert.metadata import build_metadata, embed_edgevit

    content = tiny_tflite(path).read_bytes()
    labels = [f"class_{i}" for i in range(1000)]
    meta = build_metadata(
        model_name="mobilevit_v3_xs", family="mobilevit_v3", precision="int8", weights="random-init", labels=labels,
        labels_file="m.labels.txt", graph_input={"shape": [1, 8, 8, 3], "dtype": "float32", "quantization": None},
        graph_output={"shape": [1, 1000], "dtype": "uint8", "quantization": {"scale": 1 / 256, "zero_point": 0}},
        preprocessing={"input_size": 8, "resize_size": 8, "interpolation": "bilinear", "mean": [0.0] * 3,
                       "std": [1.0] * 3, "value_range": [0.0, 1.0]}, output_kind="probabilities")
    path.write_bytes(embed_edgevit(content, meta))
    return path


def entries_disagreeing(path: Path) -> Path:
    """An edgevit file whose edgevit entry was rewritten with other labels,
    its standard entry left as it was."""
    from edgevit.litert.metadata import embed_edgevit, read_embedded

    content = edgevit_tflite(path).read_bytes()
    meta = read_embedded(content)
    meta["labels"] = ["wasps", "flies"]
    path.write_bytes(embed_edgevit(content, meta))
    return path


def test_metadata_that_contradicts_the_file_is_found():
    from edgevit.litert.metadata_check import metadata_problems

    with tempfile.TemporaryDirectory() as tmp:
        lying = metadata_problems(lying_tflite(Path(tmp) / "lying.tflite").read_bytes())
        disagreeing = metadata_problems(entries_disagreeing(Path(tmp) / "two.tflite").read_bytes())
        honest = metadata_problems(edgevit_tflite(Path(tmp) / "honest.tflite").read_bytes())
    assert any("output is uint8 [1, 1000]; the graph's is float32 [1, 2]" in p for p in lying)
    assert any("says int8; the graph computes in float" in p for p in lying)
    assert any("does not end in a softmax" in p for p in lying)
    assert disagreeing == ["the standard metadata's labels differ from edgevit metadata's"]
    assert honest == []


@pytest.mark.parametrize("make", [lying_tflite, entries_disagreeing], ids=["lying", "entries-disagree"])
def test_eval_and_bundle_refuse_metadata_that_contradicts_the_file(tmp_path, monkeypatch, make):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "m.tflite")
    demo_folder(tmp_path)
    data = _data(tmp_path, per_class=2)
    before = snapshot(tmp_path)
    for args in (["eval", "m.tflite", "--data", data], ["bundle", "m.tflite", "--android-demo", "demo"]):
        code, out, err = run(*args)
        assert code == 1 and "Traceback" not in err, (args, err)
        assert err.count("error:") == 1 and "m.tflite: its metadata contradicts the file" in err, err
    assert snapshot(tmp_path) == before


def test_bench_and_check_flag_metadata_that_contradicts_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lying_tflite(tmp_path / "lying.tflite")
    code, out, err = run("bench", "lying.tflite", "--threads", "1", "--runs", "1", "--host-kernels", "xnnpack",
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    assert any("lying.tflite: its metadata contradicts the file" in w for w in report["warnings"])
    assert {(r["model"], r["precision"]) for r in report["results"]} == {("lying", "fp32")}
    code, out, err = run("check", "lying.tflite", "--nnapi")
    assert code == 0 and "metadata contradicts the file" in out, out
    code, out, err = run("check", "lying.tflite", "--nnapi", "--json")
    assert json.loads(out)["metadata"]["problems"]


# The environment a command starts in: its Keras backend, its standard streams, its memory limit.

def edgevit_process(*args, env=None, limit_address_space=None, shell_redirect=""):
    """`python -m edgevit ARGS` as a shell would start it: with ``env`` added
    to the environment, an address-space limit (`ulimit -v`) and a
    redirection such as ``>&-``."""
    def limit():
        if limit_address_space:
            resource.setrlimit(resource.RLIMIT_AS, (limit_address_space, resource.getrlimit(resource.RLIMIT_AS)[1]))

    command = " ".join([sys.executable, "-m", "edgevit", *args, shell_redirect])
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, preexec_fn=limit,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.parametrize("backend", ["torch", "jax", "banana"])
def test_another_keras_backend_is_one_error_line_before_keras_loads(backend):
    """torch segfaulted (exit 139, nothing said); jax (not installed) and
    banana ended in tracebacks from inside Keras."""
    proc = edgevit_process("info", "mobilevit_v3_xxs", env={"KERAS_BACKEND": backend})
    assert proc.returncode == 1
    assert proc.stderr == (f"error: KERAS_BACKEND={backend}: edgevit runs on Keras's TensorFlow backend only; unset "
                           "KERAS_BACKEND or set it to tensorflow for edgevit.\n")


def test_an_empty_keras_backend_does_not_let_keras_json_choose_another(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    proc = subprocess.run([sys.executable, "-c", "import edgevit, keras; print(keras.backend.backend())"],
                          capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "",
                                                               "KERAS_HOME": str(tmp_path)})
    assert proc.stdout == "tensorflow\n", proc.stderr


def test_a_closed_standard_output_is_one_error_line():
    """`edgevit list >&-` ended in an AttributeError traceback."""
    proc = edgevit_process("--version", shell_redirect=">&-")
    assert proc.returncode == 1
    assert proc.stderr == "error: Could not write to standard output: Bad file descriptor.\n"


def test_a_command_runs_with_its_standard_error_and_input_closed():
    """`edgevit list 2>&-` failed (exit 1) where it set TensorFlow's chatter aside."""
    proc = edgevit_process("list", "mobilevit_v3_xxs", "--json", shell_redirect="2>&- <&-")
    assert proc.returncode == 0
    assert [m["name"] for m in json.loads(proc.stdout)] == ["mobilevit_v3_xxs"]


def test_a_label_standard_output_cannot_encode_prints_escaped(tmp_path):
    """Under PYTHONIOENCODING=ascii, eval's table of a class named café
    ended in a UnicodeEncodeError traceback."""
    edgevit_tflite(tmp_path / "m.tflite", classes=("café", "bees"))
    image_folder(tmp_path / "data", classes=("café", "bees"))
    proc = edgevit_process("eval", str(tmp_path / "m.tflite"), "--data", str(tmp_path / "data"),
                           env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert "caf\\xe9" in proc.stdout


def test_an_address_space_limit_tensorflow_cannot_start_under_is_one_error_line():
    """Under `ulimit -v 1500000` a MemoryError traceback, at 2500000 an abort
    with a C++ stack and no message."""
    # info at another input size builds the model (at the default size it reads the catalog, without TensorFlow)
    proc = edgevit_process("info", "mobilevit_v3_xxs", "--input-size", "64", limit_address_space=1_500_000 * 1024)
    assert proc.returncode == 1
    assert proc.stderr == ("error: This shell limits a process to 1500000 KiB of address space (`ulimit -v`); "
                           "TensorFlow needs at least 2929687 KiB (3 GB) to start: raise it, e.g. "
                           "`ulimit -v unlimited`.\n")


def test_running_out_of_memory_is_one_error_line(monkeypatch):
    from edgevit import registry

    def out_of_memory(pattern=None):
        raise MemoryError

    monkeypatch.setattr(registry, "list_models", out_of_memory)
    code, out, err = run("list")
    assert (code, out) == (1, "")
    assert err.startswith("error: Out of memory: close other programs, raise the shell's limit (`ulimit -v`)")
