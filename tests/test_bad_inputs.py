"""Bad and unusual inputs over every command.

Each bad input ends in exit status 1, exactly one ``error:`` line on stderr
and no traceback, and leaves the folder it ran in as it was: nothing written,
nothing changed. Unusual images are read as the Android demo reads them, or
skipped and counted by reason; eval scores every image it is given; class
names travel from training into the converted file's labels; SIGTERM and a
failed replace leave no partial output."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import struct
import sys
import textwrap
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgevit.cli import main
from edgevit.data.images import FLOAT_PIXELS, NOT_AN_IMAGE, TOO_LARGE, open_rgb
from edgevit.errors import EdgevitError
from edgevit.export import pipeline
from tests.helpers import tiny_tflite

SMALL = ["mobilevit_v3_xxs", "--input-size", "64"]


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def snapshot(folder: Path) -> dict:
    """Every path under ``folder`` (hidden ones too) with a hash of its content."""
    return {str(p.relative_to(folder)): "folder" if p.is_dir() else hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


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


def _another_runs_checkpoint(tmp):
    checkpoint = tmp / "m.keras.ckpt"
    checkpoint.mkdir()
    run_of_another_model = {"command": "finetune", "model": "mobilevit_v1_xxs", "input_size": 64,
                            "classes": ["ants", "bees"], "sizes": []}
    (checkpoint / "state.json").write_text(json.dumps({"epochs_done": 3, "history": [],
                                                       "run": run_of_another_model}))
    return ["finetune", *SMALL, "--data", _data(tmp), "-o", "m.keras"]


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


def _loose_images(tmp):
    (tmp / "loose").mkdir()
    Image.new("RGB", (8, 8)).save(tmp / "loose" / "a.png")
    tiny_tflite(tmp / "m.tflite")
    return ["eval", "m.tflite", "--data", "loose"]


def _calibration_bomb(tmp):
    (tmp / "calib").mkdir()
    png_claiming(tmp / "calib" / "huge.png", 15000, 15000)
    return ["convert", "--int8", *SMALL, "--calib", "calib", "-o", "m.tflite"]


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
    # output paths, checked before any work
    pytest.param(_output_is_a_folder, "is a folder where a file would be written", id="output-is-a-folder"),
    pytest.param(_sidecar_is_a_folder, "a.labels.txt' is a folder", id="sidecar-is-a-folder"),
    pytest.param(lambda tmp: ["convert", *SMALL, "-o", "x" * 246 + ".tflite"], "bytes long; this file system takes",
                 id="output-name-too-long"),
    pytest.param(_finetune_output_is_a_folder, "is a folder where a file would be written",
                 id="finetune-output-is-a-folder"),
    pytest.param(_qat_output_is_its_input, "is the input m.keras", id="qat-output-is-its-input"),
    pytest.param(_finetune_output_is_its_weights, "is the input w.keras", id="finetune-output-is-its-weights"),
    # qat (and finetune) data and model arguments
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp, splits=("val",)), "-o", "q.keras"],
                 "has val/ but no train/", id="qat-data-without-train"),
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp, classes=("ants",)), "-o", "q.keras"],
                 "one class only", id="qat-one-class"),
    pytest.param(lambda tmp: ["qat", *SMALL, "--data", _data(tmp), "--epochs", "0", "-o", "q.keras"],
                 "0 is not in the range", id="qat-zero-epochs"),
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
    pytest.param(lambda tmp: ["eval", tiny_tflite(tmp / "m.tflite").name, "--data",
                              str(image_folder(tmp / "data", splits=("train",)))], "has train/ but no val/",
                 id="eval-data-without-val"),
    pytest.param(_loose_images, "its images lie directly in it", id="eval-loose-images"),
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
]


@pytest.mark.parametrize("setup, message", BAD_INPUTS)
def test_bad_input_is_one_error_line_and_changes_nothing(tmp_path, monkeypatch, setup, message):
    monkeypatch.chdir(tmp_path)
    args = setup(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = run(*args)
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert message in err, err
    assert snapshot(tmp_path) == before


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
    from edgevit.train.data import decode

    Image.new("RGB", (16, 16), (10, 20, 30)).save(tmp_path / "good.png")
    png_claiming(tmp_path / "huge.png", 15000, 15000)
    (tmp_path / "garbage.jpg").write_bytes(b"not a jpeg")
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "float.tif")
    files = sorted(tmp_path.iterdir())
    images, labels, skipped = decode(files, np.arange(len(files)), 8)
    assert images.shape == (1, 8, 8, 3) and labels.tolist() == [files.index(tmp_path / "good.png")]
    assert skipped.counts() == {FLOAT_PIXELS: 1, NOT_AN_IMAGE: 1, TOO_LARGE: 1}
    assert "3 unreadable image(s) skipped" in skipped.summary() and "huge.png" in skipped.summary()


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
    code, _, err = run("convert", "--fp32", "m.keras", "-o", "m.tflite", "--no-arm-run")
    assert code == 0, err
    assert (tmp_path / "m.labels.txt").read_text() == "ants\nbees\n"
    assert json.loads((tmp_path / "m.json").read_text())["labels"] == ["ants", "bees"]
    assert read_embedded((tmp_path / "m.tflite").read_bytes())["labels"] == ["ants", "bees"]


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
    code, _, err = run("convert", "--fp32", *SMALL, "--num-classes", "2", "-o", "m.tflite")
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
        if Path(src).parent == staging and Path(dst).name == "a.labels.txt":
            raise failure
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_failing_on_the_labels)
    with pytest.raises(EdgevitError if isinstance(failure, OSError) else KeyboardInterrupt):
        pipeline.replace_all(finals, staging)
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
