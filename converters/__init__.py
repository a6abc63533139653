"""Official checkpoints -> edgevit Keras weights, proven by output parity.

    from converters import import_weights
    result = import_weights("mobilevit_xxs.pth", "mobilevit_v1_xxs", output="mvit.weights.h5")

One importer per checkpoint source (``converters/timm.py``,
``converters/cvnets.py``, ``converters/hf_cvt.py``), each a table of rename
rules over Keras layer paths (``converters/common.py``).
"""
from converters.api import ImportResult, import_weights, importers_for, sources_for

__all__ = ["ImportResult", "import_weights", "importers_for", "sources_for"]
