"""Official CSWin Transformer checkpoints (microsoft/CSWin-Transformer
release files ``cswin_tiny_224.pth`` ... ``cswin_large_384.pth``).

Naming follows the official ``models/cswin.py`` (commit f111ae2, unchanged
since the v0.1.0 release): edgevit's layer names are its module paths,
except the stem, an unnamed Sequential there (conv ``.0``, LayerNorm ``.2``).
"""
from __future__ import annotations

from .registry import Importer, register
from .rules import Rule

OFFICIAL_CSWIN = "https://github.com/microsoft/CSWin-Transformer/tree/f111ae2"

RULES = [
    Rule(r"stage1_conv_embed\.conv", "stage1_conv_embed.0"),
    Rule(r"stage1_conv_embed\.norm", "stage1_conv_embed.2"),
    Rule(r"([\w.]+)", r"\1"),
]

register(Importer("official", "cswin", lambda model: RULES, reference=OFFICIAL_CSWIN, head=("head",),
                  notes="CSWin-Transformer release files (cswin_tiny_224.pth ...)"))
