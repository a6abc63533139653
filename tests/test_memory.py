"""The stages that run the Keras model over an image set hold one batch at a
time: their peak memory does not grow with the number of images."""
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from edgevit import memory
from edgevit.data.images import READ_BATCH, ImageSet
from edgevit.errors import EdgevitError
from edgevit.export import pipeline
from edgevit.export.pipeline import ExportOptions, export
from edgevit.registry import ModelSpec, Preprocessing

SIZE = 32
SPEC = ModelSpec("tiny", "test", builder=None, default_input_size=SIZE,
                 preprocessing=Preprocessing(SIZE, 36, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))

# A fresh process measures each stage (TensorFlow's CPU allocator keeps what
# a process once used): its peak resident memory over what it held before the
# stage, on 8 images and then on 512 of them. The images are one image
# broadcast, so that the set itself takes no memory, and the model's
# activations are wide (1 MB per image per tensor), so that holding more
# than a batch shows.
PEAK_GROWTH = textwrap.dedent("""
    import json, sys
    import keras
    import numpy as np
    from edgevit.export.pipeline import keras_outputs
    from edgevit.models.batchnorm import recalibrate_batchnorm

    def resident_mb(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

    inputs = keras.Input((64, 64, 3))
    x = keras.layers.Conv2D(64, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    stage = {"batchnorm": recalibrate_batchnorm, "keras_outputs": keras_outputs}[sys.argv[1]]
    image = np.random.default_rng(0).random((1, 64, 64, 3), dtype=np.float32)
    growth = {}
    for count in (8, 512):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the peak (VmHWM) starts again from what is resident now
        before = resident_mb("VmRSS")
        stage(model, np.broadcast_to(image, (count, 64, 64, 3)))
        growth[count] = resident_mb("VmHWM") - before
    print(json.dumps(growth))
""")


@pytest.mark.parametrize("stage", ["batchnorm", "keras_outputs"])
def test_a_stage_holds_one_batch_of_images_whatever_their_number(stage):
    run = subprocess.run([sys.executable, "-c", PEAK_GROWTH, stage], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    growth = json.loads(run.stdout.strip().splitlines()[-1])
    # 504 more images of the set would take 24 MB as one array, and
    # 8 more images of activations (batches of 16) 16 MB
    assert growth["512"] - growth["8"] < 8, growth


# The same for the image sets themselves, read from a folder of 256-px
# images (0.79 MB each as model inputs) by what consumes them whole: the
# converter's representative dataset and the inputs file of a LiteRT child,
# which the child reads back; on 8 images and then on 64.
IMAGE_SET_GROWTH = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import numpy as np
    from edgevit.data.images import image_set
    from edgevit.data.sample_photos import sample_images
    from edgevit.export.convert import _representative
    from edgevit.litert.run_model import saved_rows
    from edgevit.registry import Preprocessing
    from edgevit.writing import save_array

    folder, consumer = Path(sys.argv[1]), sys.argv[2]
    pre = Preprocessing(256, 256)
    files = sorted(folder.glob("*.png"))

    def representative_dataset(images):
        for _ in _representative(images, None)():
            pass

    def child_inputs(images):
        save_array(folder / "inputs.npy", images, np.float32)
        for _ in saved_rows(folder / "inputs.npy"):
            pass

    def sample_photos(images):
        representative_dataset(sample_images(pre, len(images)))

    def resident_mb(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

    consume = {"representative": representative_dataset, "child": child_inputs, "photos": sample_photos}[consumer]
    growth = {}
    for count in (8, 64):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        before = resident_mb("VmRSS")
        consume(image_set(files[:count], pre))
        growth[count] = resident_mb("VmHWM") - before
    print(json.dumps(growth))
""")


@pytest.mark.parametrize("consumer", ["representative", "child", "photos"])
def test_an_image_set_is_read_a_batch_at_a_time_whatever_its_size(tmp_path, consumer):
    noise = np.random.default_rng(0).integers(0, 256, (64, 256, 256, 3), dtype=np.uint8)
    for i, pixels in enumerate(noise):
        Image.fromarray(pixels).save(tmp_path / f"{i:02d}.png", compress_level=0)
    run = subprocess.run([sys.executable, "-c", IMAGE_SET_GROWTH, str(tmp_path), consumer], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    growth = json.loads(run.stdout.strip().splitlines()[-1])
    # the 56 more images would take 44 MB as one array
    assert growth["64"] - growth["8"] < 8, growth


def test_every_stage_takes_the_images_a_batch_at_a_time(tmp_path, monkeypatch):
    folder = tmp_path / "images"
    folder.mkdir()
    for i, pixels in enumerate(np.random.default_rng(0).integers(0, 256, (40, 40, 40, 3), dtype=np.uint8)):
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    slices = []
    read = ImageSet.__getitem__

    def recorded(images, index):
        batch = read(images, index)
        slices.append(len(batch) if isinstance(index, slice) else 1)
        return batch

    monkeypatch.setattr(ImageSet, "__getitem__", recorded)
    options = ExportOptions(output=str(tmp_path / "tiny.tflite"), calib_dir=str(folder), calib_samples=24,
                            validation_samples=16, recalibrate_batchnorm=True, gpu_images=0,
                            diagnose_below_cosine=1.01)  # diagnosed whatever the agreement
    export(tiny_convnet(batchnorm=True), SPEC, options)
    assert max(slices) <= READ_BATCH, slices
    # BatchNorm estimation and calibration read the 24, validation the 16 three times, the diagnosis 2
    assert sum(slices) >= 2 * 24 + 3 * 16 + 2, slices


def tiny_convnet(batchnorm=False):
    import keras

    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=2)(inputs)
    if batchnorm:
        x = keras.layers.BatchNormalization()(x)
    return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(x)), name="tiny")


def out_of_memory(*args, **kwargs):
    raise MemoryError


def converter_out_of_memory(*args, **kwargs):
    try:
        out_of_memory()
    except MemoryError as err:  # as edgevit.export.convert reports any converter failure
        raise EdgevitError("TFLite conversion (int8) of tiny failed: std::bad_alloc") from err


@pytest.mark.parametrize("function, failing, stage, advice", [
    ("convert", out_of_memory, "conversion", "use a smaller --input-size or fewer --calib-samples"),
    ("convert", converter_out_of_memory, "conversion", "use a smaller --input-size or fewer --calib-samples"),
    ("layerwise_comparison", out_of_memory, "layer-by-layer diagnosis", "skip it with --no-diagnosis"),
])
def test_a_stage_out_of_memory_ends_in_one_error_naming_it_and_what_to_do(tmp_path, monkeypatch, function,
                                                                          failing, stage, advice):
    monkeypatch.setattr(pipeline, function, failing)
    options = ExportOptions(output=str(tmp_path / "tiny.tflite"), calib_samples=4, validation_samples=2,
                            gpu_images=0, diagnose_below_cosine=1.01)  # diagnosed whatever the agreement
    with pytest.raises(EdgevitError) as raised:
        export(tiny_convnet(), SPEC, options)
    message = str(raised.value)
    assert message.startswith(f"Out of memory in the {stage} stage: {advice}") and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def fake_machine(tmp_path, monkeypatch, mem_available_kb=16_000_000, cgroup_line="0::/", limits=None):
    """/proc/meminfo, /proc/self/cgroup and the cgroup folders as a machine
    with ``mem_available_kb`` available and ``limits`` (folder -> {file: text})."""
    (tmp_path / "meminfo").write_text(f"MemTotal: 32000000 kB\nMemAvailable: {mem_available_kb} kB\n")
    (tmp_path / "cgroup").write_text(cgroup_line + "\n")
    for folder, files in (limits or {}).items():
        (tmp_path / "fs" / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / "fs" / folder / name).write_text(text)
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory, "CGROUPS", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "fs")


@pytest.mark.parametrize("cgroup_line, limits, available", [
    ("0::/", {}, 16_000_000 * 1024),
    # a v2 job limit: 500 MB, 400 MB used of which 50 MB reclaimable cache
    ("0::/ci/job", {"ci/job": {"memory.max": "500000000", "memory.current": "400000000",
                               "memory.stat": "anon 350000000\ninactive_file 50000000\n"}}, 150_000_000),
    # the parent's limit is the tighter one
    ("0::/ci/job", {"ci": {"memory.max": "300000000", "memory.current": "250000000"},
                    "ci/job": {"memory.max": "max", "memory.current": "240000000"}}, 50_000_000),
    # v1: no limit set is a huge number
    ("4:memory:/docker/abc", {"memory/docker/abc": {"memory.limit_in_bytes": "9223372036854771712",
                                                    "memory.usage_in_bytes": "100"}}, 16_000_000 * 1024),
    ("4:memory:/docker/abc", {"memory/docker/abc": {"memory.limit_in_bytes": "2000000000",
                                                    "memory.usage_in_bytes": "1900000000"}}, 100_000_000),
])
def test_available_memory_is_the_kernels_or_less_under_a_cgroup_limit(tmp_path, monkeypatch, cgroup_line, limits,
                                                                    available):
    fake_machine(tmp_path, monkeypatch, cgroup_line=cgroup_line, limits=limits)
    assert memory.available_memory() == available


# (stage, model, its float32 weights, one image's activations, what the stage took in GB) from
# benchmarks/memory.py on 2026-11-27 (docs/profiling.md, Memory): the models whose stages needed least
# for their size, and the headline.
MEASURED = [
    ("conversion", "mobilevit_v2_050", 6e6, 96e6, 0.18),
    ("conversion", "mobilevit_v3_xxs_l2", 5e6, 59e6, 0.16),
    ("conversion", "resmlp_12", 61e6, 67e6, 1.06),
    ("conversion", "mobilevit_v3_xs", 10e6, 159e6, 0.24),
    ("conversion", "vit_large16", 1.22e9, 351e6, 19.65),
    ("layer-by-layer diagnosis", "mobilevit_v2_050", 6e6, 96e6, 0.20),
    ("layer-by-layer diagnosis", "vit_tiny16", 23e6, 34e6, 0.36),
    ("BatchNorm estimation", "mobilevit_v3_xxs_l2", 5e6, 59e6, 0.05),
]


@pytest.mark.parametrize("stage, model, weights, activations, took_gb", MEASURED)
def test_a_stages_estimate_is_below_what_it_took(stage, model, weights, activations, took_gb):
    assert memory.need_for(stage, weights, activations) < took_gb * 1e9


def test_a_models_weights_and_activations_are_counted():
    import keras

    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)  # 32 x 32 x 8 outputs, 3 x 3 x 3 x 8 + 8 weights
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(x)))
    assert memory.weight_and_activation_bytes(model) == (4 * (224 + 36), 4 * (32 * 32 * 3 + 32 * 32 * 8 + 8 + 4))


@pytest.mark.parametrize("batchnorm, stage, advice", [
    (True, "BatchNorm estimation",
     "use fewer --calib-samples or a smaller --input-size, or give trained --weights"),
    (False, "conversion", "use a smaller --input-size or fewer --calib-samples"),
])
def test_a_stage_that_cannot_fit_is_refused_before_it_runs(tmp_path, monkeypatch, batchnorm, stage, advice):
    fake_machine(tmp_path, monkeypatch, mem_available_kb=10_000)
    ran = []
    monkeypatch.setattr(pipeline, "convert", lambda *args, **kwargs: ran.append("conversion"))
    out = tmp_path / "out"
    out.mkdir()
    options = ExportOptions(output=str(out / "tiny.tflite"), calib_samples=4, validation_samples=2, gpu_images=0,
                            recalibrate_batchnorm=batchnorm)
    with pytest.raises(EdgevitError) as raised:
        export(tiny_convnet(batchnorm=True), SPEC, options)
    message = str(raised.value)
    assert message.startswith(f"Not enough memory for the {stage} stage: it needs about ") and "\n" not in message
    # about 10 MB available, shown with the decimals that tell it from the need
    assert re.search(rf" GB and 0\.0\d? GB is available: {re.escape(advice)}\.$", message), message
    assert ran == [] and list(out.iterdir()) == []

