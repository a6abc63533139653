"""Output parity between a PyTorch reference model and its imported edgevit
twin: the proof the importers are right (tests/test_converters_*.py).

timm imports torchvision at import time only for data pipelines and feature
extraction, none of which building a model uses. torchvision has no wheel
for every torch build, so when it is absent :func:`import_timm` installs an
inert stand-in module for it first.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import numpy as np


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})

    def __call__(cls, *args, **kwargs):
        raise RuntimeError("torchvision is not installed (edgevit's stand-in cannot run it)")


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0+edgevit-stand-in"
        return module

    def exec_module(self, module):
        pass


def import_timm():
    """``import timm``, with a torchvision stand-in when torchvision is missing."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if not any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
            for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
                del sys.modules[name]
            sys.meta_path.append(_TorchvisionStandIn())
    import timm

    return timm


def randomize_(module, seed: int = 0) -> None:
    """Give every parameter and buffer of a PyTorch module random values of a
    sensible scale, so that parity is tested on weights that exercise every
    path: BatchNorm statistics away from (0, 1), norm scales away from 1,
    non-zero biases and embeddings."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    # buffers a state dict leaves out are computed, not learned (Swin's shift
    # masks and coordinate tables, SwinV2's zero key bias): kept as they are
    saved = set(module.state_dict())
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point() or name not in saved:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "running_var":
                t.copy_(torch.rand(t.shape, generator=gen) * 1.5 + 0.5)
            elif leaf == "running_mean":
                t.copy_(torch.randn(t.shape, generator=gen) * 0.2)
            elif t.ndim <= 1:
                if leaf == "weight":  # norm scales
                    t.copy_(torch.rand(t.shape, generator=gen) * 0.8 + 0.6)
                else:
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
            elif "pos_embed" in name or "token" in name or "embed" in leaf:
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
            else:
                fan_in = max(1, t[0].numel())
                t.copy_(torch.randn(t.shape, generator=gen) * (1.0 / fan_in) ** 0.5)


def torch_logits(module, images_nhwc: np.ndarray) -> np.ndarray:
    import torch

    module.eval()
    with torch.no_grad():
        out = module(torch.from_numpy(np.ascontiguousarray(images_nhwc.transpose(0, 3, 1, 2))))
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "logits"):
        out = out.logits
    if out.ndim == 4:  # a segmenter's NCHW logits, NHWC as the Keras model gives them
        out = out.permute(0, 2, 3, 1)
    return out.detach().numpy()


def keras_logits(model, images_nhwc: np.ndarray) -> np.ndarray:
    return np.asarray(model(images_nhwc, training=False))


def scale_logits_(module, head, images_nhwc: np.ndarray, target_std: float = 3.0) -> None:
    """Scale the classifier ``head`` (a torch Linear, or several) so the random model's
    logits spread like a trained model's (std ~3): a 1e-4 bound on
    near-zero logits would prove little."""
    import torch

    std = float(torch_logits(module, images_nhwc).std())
    heads = list(head) if isinstance(head, (tuple, list, torch.nn.ModuleList)) else [head]
    if std > 0:
        with torch.no_grad():
            for h in heads:
                h.weight.mul_(target_std / std)
                if h.bias is not None:
                    h.bias.mul_(target_std / std)


def compare(reference, model, images_nhwc: np.ndarray) -> dict:
    """Max abs logit difference between a torch reference and a Keras model."""
    a, b = torch_logits(reference, images_nhwc), keras_logits(model, images_nhwc)
    return {"max_abs_diff": float(np.abs(a - b).max()), "logit_std": float(a.std()),
            "top1_agree": float((a.argmax(-1) == b.argmax(-1)).mean())}
