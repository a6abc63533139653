"""Files that the standard Android clients load: MediaPipe Tasks' and the
TFLite Task Library's ImageClassifier read each precision's file of a small
model fine-tuned on real photos (hymenoptera, ../shared) and the headline
file, show the model's labels as category names, give probabilities, and
pick LiteRT's top-1 on the same crop."""
from __future__ import annotations

import numpy as np
import pytest

import edgevit
from edgevit.data.images import read_pixels
from edgevit.data.listing import list_images
from edgevit.data.transforms import normalise
from edgevit.export.pipeline import ExportOptions, export
from edgevit.litert.inputs import file_inputs
from edgevit.litert.metadata import read_embedded
from edgevit.litert.run_model import run_in_process
from edgevit.litert.standard_metadata import read_standard
from edgevit.registry import get_spec
from edgevit.saving import set_class_names
from tests.standard_clients import classify, missing

CLIENTS = ("mediapipe", "task_library")
PRECISIONS = ("fp32", "fp16", "dynamic", "int8", "int8_mixed", "int16x8")
# The Task Library's last release (tflite-support 0.4.4) runs a TFLite of 2022: it lacks the op versions of
# dynamic-range files and int16 kernels.
TASK_LIBRARY_REFUSES = {"dynamic": "FULLY_CONNECTED' version", "int16x8": "AllocateTensors() failed"}
# a small model whose preprocessing is ImageNet's per-channel mean and std:
# its uint8 file normalises the bytes with a 1x1 depthwise convolution
FINE_TUNED, SIZE = "deit_tiny", 64
CLASSES = ["ants", "bees"]


def _crops(folder, pre) -> tuple[np.ndarray, np.ndarray]:
    pixels, labels = [], []
    for label, name in enumerate(CLASSES):
        files = list_images(folder / name)
        pixels += list(read_pixels(files, pre))
        labels += [label] * len(files)
    return np.stack(pixels), np.asarray(labels)


@pytest.fixture(scope="module")
def photos(request):
    from tests.conftest import SHARED

    data = SHARED / "data" / "hymenoptera"
    if not data.is_dir():
        pytest.skip("../shared/data/hymenoptera is not present (opt-in test)")
    pre = get_spec(FINE_TUNED).preprocessing_at(SIZE)
    return _crops(data / "train", pre), _crops(data / "val", pre)


@pytest.fixture(scope="module")
def fine_tuned_files(photos, tmp_path_factory):
    """Every precision's file of deit_tiny at 64 px, trained on hymenoptera's
    train photos (val top-1 about 70%)."""
    import keras

    keras.utils.set_random_seed(0)
    (train_pixels, train_labels), _ = photos
    pre = get_spec(FINE_TUNED).preprocessing_at(SIZE)
    model = edgevit.create_model(FINE_TUNED, num_classes=len(CLASSES), input_size=SIZE)
    set_class_names(model, CLASSES)
    model.compile(optimizer=keras.optimizers.AdamW(3e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(normalise(train_pixels, pre), train_labels, batch_size=32, epochs=8, verbose=0)
    tmp = tmp_path_factory.mktemp("clients")
    files = {}
    for precision in PRECISIONS:
        opts = ExportOptions(precision=precision, output=str(tmp / f"ants_bees_{precision}.tflite"), calib_samples=32,
                             validation_samples=8, gpu_images=0, weights_label="fine-tuned on hymenoptera")
        files[precision] = export(model, get_spec(FINE_TUNED), opts).files.model
    return files


_LITERT: dict = {}


def litert_probabilities(path, pixels: np.ndarray, pre) -> np.ndarray:
    """LiteRT's outputs of ``path`` on ``pixels`` (computed once per file and images for both clients)."""
    key = (str(path), pixels.shape, pixels[:, 0, 0].tobytes())
    if key not in _LITERT:
        content = path.read_bytes()
        _LITERT[key] = run_in_process(content, file_inputs(content, normalise(pixels, pre)))
    return _LITERT[key]


def assert_client_agrees(client: str, path, pixels: np.ndarray, pre, labels: list[str], tmp_path,
                         decided_at_least: float = 0.8) -> None:
    """The client loads ``path``, names its categories with ``labels``, gives
    probabilities, and picks LiteRT's top-1 on at least 95% of ``pixels``
    (images where LiteRT's top two lie within two output steps count apart;
    at least ``decided_at_least`` of them must not)."""
    results = classify(client, path, pixels, tmp_path)
    assert not isinstance(results, str), f"{client} refused {path.name}: {results}"
    reference = litert_probabilities(path, pixels, pre)
    step = 1 / 256 if read_embedded(path.read_bytes())["output"]["dtype"] == "uint8" else 1e-6
    agree = ties = 0
    for top, probs in zip(results, reference):
        assert all(labels[index] == name for index, name, _ in top), top
        scores = [score for *_, score in top]
        assert all(0.0 <= s <= 1.0 + 1e-6 for s in scores) and sum(scores) <= 1.0 + 1e-3 * len(scores), scores
        ordered = np.sort(probs)[::-1]
        if ordered[0] - ordered[1] <= 2 * step:
            ties += 1
            continue
        agree += top[0][0] == int(np.argmax(probs))
    decided = len(results) - ties
    assert decided >= decided_at_least * len(results), f"{ties} of {len(results)} images tie"
    assert agree >= 0.95 * decided, f"{client} picks LiteRT's top-1 on {agree} of {decided} images of {path.name}"


def installed_clients() -> list[str]:
    clients = [client for client in CLIENTS if not missing(client)]
    if not clients:
        pytest.skip("; ".join(missing(client) for client in CLIENTS))
    return clients


# One test per fixture, not one per precision and client: pytest-xdist builds a module's fixtures once per
# worker that runs its tests, and the fine-tuned model and its six files take minutes.
@pytest.mark.shared_data
def test_clients_load_every_precision_with_names_and_probabilities(photos, fine_tuned_files, tmp_path):
    assert_both_metadata_entries_say_the_same(fine_tuned_files)
    _, (val_pixels, _) = photos
    pre = get_spec(FINE_TUNED).preprocessing_at(SIZE)
    for client in installed_clients():
        for precision in PRECISIONS:
            path = fine_tuned_files[precision]
            if client == "task_library" and precision in TASK_LIBRARY_REFUSES:
                refusal = classify(client, path, val_pixels[:1], tmp_path)
                assert isinstance(refusal, str) and TASK_LIBRARY_REFUSES[precision] in refusal, refusal
                continue
            assert_client_agrees(client, path, val_pixels, pre, CLASSES, tmp_path)


def assert_both_metadata_entries_say_the_same(fine_tuned_files) -> None:
    for precision, path in fine_tuned_files.items():
        content = path.read_bytes()
        edgevit_meta, standard = read_embedded(content), read_standard(content)
        output = standard["subgraph_metadata"][0]["output_tensor_metadata"][0]
        assert output["name"] == "probability" and edgevit_meta["output"]["kind"] == "probabilities"
        assert standard["files"]["labels.txt"].decode().split() == CLASSES == edgevit_meta["labels"]
        _, normalization = standard["subgraph_metadata"][0]["input_tensor_metadata"][0]["process_units"][0]["options"]
        # ImageNet's per-channel mean and std live inside the file: a client passes the bytes (uint8) as they
        # are, or pixels / 255 (float; MediaPipe refuses per-channel normalisation)
        if precision == "int8":
            assert (edgevit_meta["input"]["dtype"], edgevit_meta["input"]["takes"]) == ("uint8", "rgb_bytes")
            assert normalization == {"mean": [0.0], "std": [1.0]}
        else:
            assert (edgevit_meta["input"]["dtype"], edgevit_meta["input"]["takes"]) == ("float32", "rgb_unit")
            assert normalization == {"mean": [0.0], "std": [255.0]}


@pytest.mark.shared_data
def test_clients_load_the_headline_file(headline_file, tmp_path):
    """`edgevit convert --int8 mobilevit_v3_xs` as the README runs it (random
    weights: most images are ties at 1/256, so only the rest count)."""
    path, pixels = headline_file
    for client in installed_clients():
        assert_client_agrees(client, path, pixels, get_spec("mobilevit_v3_xs").preprocessing_at(256),
                             read_embedded(path.read_bytes())["labels"], tmp_path, decided_at_least=0.0)


@pytest.fixture(scope="module")
def headline_file(tmp_path_factory):
    from tests.conftest import SHARED

    folder = SHARED / "data" / "imagenet-sample"
    if not folder.is_dir():
        pytest.skip("../shared/data/imagenet-sample is not present (opt-in test)")
    spec = get_spec("mobilevit_v3_xs")
    pre = spec.preprocessing_at(256)
    files = list_images(folder)[:32]
    pixels = np.stack(list(read_pixels(files, pre)))
    out = tmp_path_factory.mktemp("headline") / "mobilevit_v3_xs_int8.tflite"
    opts = ExportOptions(precision="int8", output=str(out), recalibrate_batchnorm=True, validation_samples=8,
                         gpu_images=0)
    export(edgevit.create_model("mobilevit_v3_xs"), spec, opts)
    return out, pixels
