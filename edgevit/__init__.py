"""edgevit: vision transformers from Keras 3 to fully-int8 LiteRT models on phones."""
import os

# Set before Keras is imported: an empty KERAS_BACKEND would let ~/.keras/keras.json choose another backend.
if not os.environ.get("KERAS_BACKEND"):
    os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from edgevit.errors import EdgevitError  # noqa: E402
from edgevit.registry import create_features, create_model, get_spec, list_models  # noqa: E402

__version__ = "0.1.0"


def keras_backend_problem() -> str | None:
    """Why the Keras backend chosen by KERAS_BACKEND cannot run edgevit (None:
    it can). Every model, layer and converter of edgevit is built on the
    TensorFlow backend; another one failed deep inside Keras or the
    converter, or crashed the process (torch). Checked before Keras is
    imported, since Keras fixes its backend on import."""
    backend = os.environ["KERAS_BACKEND"]
    if backend == "tensorflow":
        return None
    return (f"KERAS_BACKEND={backend}: edgevit runs on Keras's TensorFlow backend only; unset KERAS_BACKEND "
            "or set it to tensorflow for edgevit.")
__all__ = ["EdgevitError", "create_features", "create_model", "get_spec", "list_models", "__version__"]
