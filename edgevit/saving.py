"""Loading edgevit models and weights from files, with clear errors."""
from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

from edgevit.errors import EdgevitError, first_line
from edgevit.registry import ModelSpec, create_model, get_spec

MODEL_SUFFIX = ".keras"


def _existing_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise EdgevitError(f"{what} {str(path)!r} does not exist.")
    if not path.is_file():
        raise EdgevitError(f"{what} {str(path)!r} is not a file.")
    return path


def spec_of(model) -> ModelSpec:
    """The registered spec a Keras model was built from (models carry their
    variant name as ``model.name``)."""
    try:
        return get_spec(model.name)
    except EdgevitError:
        raise EdgevitError(f"Model {model.name!r} is not an edgevit model "
                           "(its name matches no registered variant).") from None


def load_model(path: str | Path):
    """Load a ``.keras`` file written by edgevit (or by ``model.save``)."""
    import keras

    import edgevit.layers  # noqa: F401  (registers the custom layers)
    import edgevit.models  # noqa: F401
    import edgevit.quantize.layers  # noqa: F401  (registers the QAT layers)

    path = _existing_file(path, "Model file")
    if path.suffix != MODEL_SUFFIX or not zipfile.is_zipfile(path):
        raise EdgevitError(f"{str(path)!r} is not a Keras model file (.keras).")
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as err:
        raise EdgevitError(f"Could not load {str(path)!r}: {first_line(err)}") from err
    spec_of(model)
    return model


def load_weights_into(model, path: str | Path) -> None:
    """Load a ``.weights.h5`` file, or the weights of a ``.keras`` file, into
    ``model``; architecture mismatches name the first tensor that differs."""
    path = _existing_file(path, "Weights file")
    if path.suffix == MODEL_SUFFIX:
        source = load_model(path)
        copy_weights(source, model, str(path))
        return
    if not path.name.endswith(".weights.h5"):
        raise EdgevitError(f"{str(path)!r} is not a Keras weights file: expected NAME.weights.h5 "
                           "or NAME.keras (PyTorch checkpoints go through `edgevit import-weights`).")
    import h5py

    try:
        with h5py.File(path, "r"):
            pass
    except OSError as err:
        raise EdgevitError(f"Weights file {str(path)!r} is corrupt or not HDF5: {first_line(err)}") from err
    before = model.get_weights()
    try:
        # Keras only warns when some layers' weights do not fit and loads the rest.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(path)
        misfits = [str(w.message) for w in caught if "could not be loaded" in str(w.message)]
        if misfits:
            raise ValueError(" ".join(misfits[0].split()))
    except Exception as err:
        model.set_weights(before)
        raise EdgevitError(f"Weights in {str(path)!r} do not fit {model.name}: {first_line(err)}") from err


def copy_weights(source, target, source_label: str) -> None:
    src, dst = source.weights, target.weights
    for s, d in zip(src, dst):
        if tuple(s.shape) != tuple(d.shape):
            raise EdgevitError(f"Weights in {source_label} do not fit {target.name}: "
                               f"{s.path} has shape {tuple(s.shape)}, {d.path} needs {tuple(d.shape)}.")
    if len(src) != len(dst):
        raise EdgevitError(f"Weights in {source_label} do not fit {target.name}: "
                           f"{len(src)} tensors given, {len(dst)} expected.")
    target.set_weights(source.get_weights())


def resolve_model(name_or_path: str, num_classes: int | None = None, input_size: int | None = None,
                  weights: str | None = None):
    """A registered name or a ``.keras`` file -> (model, spec). A ``.keras``
    model is rebuilt when another input size is asked for."""
    if name_or_path.endswith(MODEL_SUFFIX) or Path(name_or_path).is_file():
        model = load_model(name_or_path)
        spec = spec_of(model)
        if num_classes not in (None, model.outputs[0].shape[-1]):
            raise EdgevitError(f"{name_or_path} has {model.outputs[0].shape[-1]} classes; "
                               "--num-classes cannot change a trained model's head.")
        if weights is not None:
            load_weights_into(model, weights)
        if input_size not in (None, model.inputs[0].shape[1]):
            resized = create_model(spec.name, num_classes=model.outputs[0].shape[-1], input_size=input_size)
            copy_weights(model, resized, name_or_path)
            model = resized
        return model, spec
    model = create_model(name_or_path, num_classes=1000 if num_classes is None else num_classes,
                         input_size=input_size, weights=weights)
    return model, get_spec(name_or_path)

