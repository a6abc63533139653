"""edgevit: vision transformers from Keras 3 to fully-int8 LiteRT models on phones."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from edgevit.errors import EdgevitError  # noqa: E402
from edgevit.registry import create_model, get_spec, list_models  # noqa: E402

__version__ = "0.1.0"
__all__ = ["EdgevitError", "create_model", "get_spec", "list_models", "__version__"]
