"""Quantization-aware training: a Keras model that computes what its int8
LiteRT file computes, value for value.

The QAT rewrite and its rules:

- ``qat``: turns a float model into its quantization-aware twin
  (:func:`~edgevit.quantize.qat.quantize_model`), calibrates and reads its
  ranges.
- ``registry``: how each layer class is treated (where its int8 tensors get
  a range, which class replaces it); :func:`~edgevit.quantize.registry.register`
  adds a class of your own.

What the twin is built from, each module mirroring one part of LiteRT:

- ``quantizers``: the fake-quant ops the converter reads ranges from
  (activations, kernels, constants).
- ``int8_ranges``: a range's int8 scale and zero point as the converter
  computes them, and the output ranges LiteRT fixes.
- ``kernel_arithmetic``: how LiteRT's int8 kernels (XNNPACK and builtin)
  round each op's result.
- ``conv_dense_layers``: Conv2D, DepthwiseConv2D and Dense on int8 kernels
  with int32 accumulators and biases.
- ``quantized_points``: the mixin that places the int8 tensors inside a layer
  of several ops.
- ``multi_op_layers``: those layers (activations, LayerNorm, attention,
  tokens, ...).
- ``export_trace``: what changes while the converter traces the model.
- ``graph_rewrites``: the QAT model's graphs run without TF's graph optimizer.

Saved ``.keras`` files name these layer classes ``edgevit.qat>ClassName``;
:func:`edgevit.saving.load_model` registers them.
"""
