"""The stages that run the Keras model over an image set hold one batch at a
time: their peak memory does not grow with the number of images."""
import json
import subprocess
import sys
import textwrap

import pytest

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


def tiny_convnet():
    import keras

    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, strides=2)(inputs)
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
