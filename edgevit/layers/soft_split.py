"""PyTorch's ``nn.Unfold`` (im2col) in tensors of rank 4, for TFLite.

TFLite has no ``extract_patches``. Here every output pixel's k x k patch is
written out as channels by a depthwise convolution with a constant one-hot
kernel: input channel c has k*k outputs (depth multiplier k*k), output
``c * k*k + i * k + j`` copying the pixel at kernel offset (i, j). That is
``nn.Unfold``'s (channel, row, column) order, so the weights of whatever
reads the patches (a LayerNorm, a linear layer) need no permutation. The
copy is exact in every precision (int8: the one-hot weights are 127 * 1/127,
the output keeps the input's range) and costs k*k multiply-adds per output
value (T2T-ViT-7's two splits: 26.6M of ~1.1G).
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops


def output_size(size: int, kernel_size: int, strides: int, padding: int) -> int:
    return (size + 2 * padding - kernel_size) // strides + 1


@keras.saving.register_keras_serializable(package="edgevit")
class SoftSplit(keras.layers.Layer):
    """``[B, H, W, C]`` -> ``[B, H', W', C * k * k]``: the zero-padded k x k
    patches at stride ``strides`` (``nn.Unfold(k, stride, padding)`` with
    its ``[B, C*k*k, L]`` output as an NHWC map). No weights."""

    def __init__(self, kernel_size: int, strides: int, padding: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size, self.strides, self.padding = int(kernel_size), int(strides), int(padding)

    def build(self, input_shape):
        k, channels = self.kernel_size, input_shape[-1]
        one_hot = np.eye(k * k, dtype="float32").reshape(k, k, 1, k * k)
        self._kernel = np.ascontiguousarray(np.broadcast_to(one_hot, (k, k, channels, k * k)))

    def call(self, x):
        p = self.padding
        if p:
            x = ops.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
        return ops.depthwise_conv(x, ops.convert_to_tensor(self._kernel, x.dtype), strides=self.strides,
                                  padding="valid")

    def compute_output_shape(self, input_shape):
        b, h, w, c = input_shape
        k, s, p = self.kernel_size, self.strides, self.padding
        return (b, output_size(h, k, s, p), output_size(w, k, s, p), c * k * k)

    def get_config(self):
        return {**super().get_config(), "kernel_size": self.kernel_size, "strides": self.strides,
                "padding": self.padding}
