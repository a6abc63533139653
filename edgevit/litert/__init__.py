"""Everything edgevit does with LiteRT files, in one place. Used by export/
and profile/; imports neither: running a file and comparing its outputs
are litert's job.

Reading and running files:

- ``flatbuffer``: the one reader (and writer) of .tflite flatbuffers: ops,
  tensors, constants, builtin options; no interpreter, no TensorFlow.
- ``interpreter``: the one way to build a LiteRT interpreter, and how a
  child process that ran one failed.
- ``inputs``: what to run a file on when checking it on other kernels.
- ``run_model``: running a file on inputs, in this process or in a child
  process (the crash of a kernel is the child's), streamed or at once.
- ``agreement``: how closely two sets of outputs agree (top-1, cosine).
- ``logits_view``: a file that outputs probabilities, seen with its logits
  as the output; a detector's without its post-processing op (what
  comparisons read).
- ``xnnpack``: which ops XNNPACK takes on this machine, read from a real
  interpreter.
- ``accelerator``: a run on LiteRT's GPU accelerator, compared with XNNPACK.
- ``arm``: LiteRT's Arm64 CPU kernels run here under emulation;
  ``arm_guest`` is the standalone script that runs inside the emulated
  Python.
- ``emulator_home``: where the emulators are installed, and how to install them.
- ``x86_levels``: this machine's LiteRT on the x86 kernels of older CPUs
  (AVX2, SSE4), under emulation: XNNPACK's int8 arithmetic differs by CPU.

Rewriting converted files (applied by ``edgevit.export.convert``):

- ``requantize``: int8 grids chosen after calibration (zero point 0 where
  XNNPACK needs it for a BATCH_MATMUL; finer grids for a mean multiplied
  back into a sum and for masked attention scores).
- ``padding``: an image stem's explicit PAD folded into its convolution.
- ``piecewise``: each int8 LayerNorm's RSQRT as two 1x1 convolutions.
- ``rewrite``: elementwise operands restored to their output's rank, which
  GPUs need.
- ``camera_input``: a full-integer file's input turned into the camera's
  uint8 RGB bytes.
- ``detection_postprocess``: a detector's raw file with TFLite's detection
  post-processing op (box decoding, NMS) appended, and seen without it.

Metadata:

- ``metadata``: edgevit's metadata document, embedded and read back.
- ``metadata_fields``: whether that document is well formed: every field
  there, of its type and in its range.
- ``standard_metadata``: the standard TFLite metadata entry (and labels)
  that MediaPipe Tasks and the Task Library read, read within bounds.
- ``packed_files``: the zip appended to a model (the labels), read within
  bounds.
- ``metadata_check``: whether what a file's metadata says is what the file is.

Delegate rules (which ops a delegate would leave on the CPU):

- ``gpu_rules``: the GPU delegate's, op by op.
- ``nnapi_rules``: the NNAPI delegate's, op by op, per Android API level.
- ``delegates``: what both share: the report types, the partitioning into
  delegated subsets, and ``check()`` over both.
"""
