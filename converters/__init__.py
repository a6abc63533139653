"""Official checkpoints -> edgevit Keras weights, proven by output parity.

    from edgevit.converters import import_weights
    result = import_weights("mobilevit_xxs.pth", "mobilevit_v1_xxs", output="mvit.weights.h5")

Installed as ``edgevit.converters`` from the repository folder
``converters/``. One importer per checkpoint source (``timm.py``,
``cvnets.py``, ``hf_cvt.py``), each a table of rename rules over Keras layer
paths (``rules.py``) with layout transforms (``layouts.py``), registered in
``registry.py``; ``checkpoints.py`` reads and writes the files.
"""
from .api import ImportResult, import_weights, importers_for, sources_for

__all__ = ["ImportResult", "import_weights", "importers_for", "sources_for"]
