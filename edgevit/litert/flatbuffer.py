"""The one reader of .tflite flatbuffers in edgevit: the operators of a file
with everything the graph audit and the delegates look at (op name and
version, tensor dtypes and shapes, which inputs are constants, each op's
builtin options: strides, masks, fused activation, ...).

Read with the schema bindings LiteRT ships, so no interpreter is built, no
TensorFlow is imported, and files that do not load still get described.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError, cause, file_problem

FILE_IDENTIFIER = b"TFL3"
# The largest metadata entry read: edgevit's document with the labels of
# ImageNet-21k's 21,841 classes is about 0.6 MB, a standard entry a few KB.
MAX_METADATA_BYTES = 16 << 20
# An honest flatbuffer holds each table, vector and string it references; a
# writer may share some. One that references more than this many times its
# own size shares tables over and over, nested: a "billion laughs" (an 8 KB
# .tflite whose 1000 subgraphs are one subgraph of 1000 shared tensors kept
# `check` unpacking for minutes; a 1.7 KB standard metadata entry read as
# 10^8 values took gigabytes).
MAX_REFERENCED_PER_BYTE = 4


@dataclass(frozen=True)
class Tensor:
    index: int
    name: str
    dtype: str            # "float32", "int8", ...
    shape: tuple[int, ...]
    is_const: bool
    scale: float | None = None
    zero_point: int | None = None
    data: np.ndarray | None = field(default=None, compare=False, repr=False)
    # The shape with -1 where the size is chosen at run time (None: the file gives none, ``shape`` is fixed).
    shape_signature: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Op:
    index: int
    name: str                     # builtin name (CONV_2D) or the custom op's code
    version: int
    inputs: list[Tensor | None]   # None for an omitted optional input
    outputs: list[Tensor]
    options: dict
    custom: bool = False

    def input(self, i: int) -> Tensor | None:
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def runtime_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if t is not None and not t.is_const]

    @property
    def const_inputs(self) -> list[Tensor]:
        return [t for t in self.inputs if t is not None and t.is_const]


@dataclass
class Graph:
    ops: list[Op]
    tensors: list[Tensor]             # by tensor index
    inputs: list[int]
    outputs: list[int]
    consumers: dict[int, list[int]]   # tensor index -> op indices reading it
    producers: dict[int, int]         # tensor index -> op index writing it
    # DEQUANTIZE ops of constant float16 weights (fp16 models): delegates fold
    # them into constants, so their outputs count as constants here.
    folded_ops: set[int] = field(default_factory=set)


def _enum_names(enum_cls) -> dict[int, str]:
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


def schema_module():
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:  # pragma: no cover - TF-only installs
        from tensorflow.lite.python import schema_py_generated as schema
    return schema


_DTYPES = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8,
           "INT64": np.int64, "INT16": np.int16, "INT8": np.int8, "FLOAT64": np.float64,
           "BOOL": np.bool_, "UINT32": np.uint32, "UINT16": np.uint16}


def _options(obj) -> dict:
    if obj is None:
        return {}
    out = {}
    for key, value in vars(obj).items():
        if isinstance(value, (np.ndarray, list)):
            value = [int(v) if isinstance(v, (np.integer, int)) else v for v in value]
        elif isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out


def read_file(path: str | Path) -> bytes:
    """The bytes of the model file at ``path``, which must be a regular file:
    a folder, a FIFO or a device (/dev/zero never ends) is refused, and so
    is a path that leads nowhere, in one error that says which."""
    problem = file_problem(path)
    if problem:
        raise EdgevitError(f"Model file {str(path)!r} {problem}.")
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise EdgevitError(f"Could not read {str(path)!r}: {cause(err)}.") from None


def _check_identifier(model_content: bytes) -> None:
    if len(model_content) < 8 or model_content[4:8] != FILE_IDENTIFIER:
        raise EdgevitError("Not a readable .tflite file (no TFL3 flatbuffer identifier).")


def _damaged(model_content: bytes, err: Exception) -> EdgevitError:
    if isinstance(err, struct.error):  # a table or vector points past the end of the bytes
        return EdgevitError(f"Truncated or not a .tflite file: its {len(model_content)} bytes end inside "
                            "the flatbuffer.")
    return EdgevitError(f"Damaged .tflite file ({type(err).__name__}: {err}).")


def read_model(model_content: bytes):
    """The whole file in the schema's object API (``ModelT``)."""
    _check_identifier(model_content)
    try:
        _check_references(model_content)
        return schema_module().ModelT.InitFromPackedBuf(bytearray(model_content), 0)
    except EdgevitError:
        raise
    except Exception as err:  # a damaged TFLite flatbuffer
        raise _damaged(model_content, err) from None


def _check_references(model_content: bytes) -> None:
    """Refuse a file that references more than MAX_REFERENCED_PER_BYTE times
    its size in what unpacking it makes: a Python object for every table an
    entry of a vector names, a copy of every string (vectors of numbers are
    unpacked as views of the file). Counted on the file as it lies, before
    anything is unpacked."""
    model = schema_module().Model.GetRootAs(model_content, 0)
    left = MAX_REFERENCED_PER_BYTE * len(model_content)

    def visit(size: int) -> None:
        nonlocal left
        left -= size
        if left < 0:
            raise EdgevitError(f"Damaged .tflite file: it references more than its {len(model_content):,} bytes can "
                               "hold (tables shared over and over).")

    visit(4 * (model.SubgraphsLength() + model.BuffersLength() + model.OperatorCodesLength()
               + model.MetadataLength() + model.SignatureDefsLength() + model.ExternalBuffersLength()
               + model.ExternalBufferGroupsLength()))
    for i in range(model.OperatorCodesLength()):
        visit(len(model.OperatorCodes(i).CustomCode() or b""))
    for i in range(model.MetadataLength()):
        visit(len(model.Metadata(i).Name() or b""))
    for i in range(model.SubgraphsLength()):
        graph = model.Subgraphs(i)
        visit(4 * (graph.TensorsLength() + graph.OperatorsLength()) + len(graph.Name() or b""))
        for j in range(graph.TensorsLength()):
            tensor, sparsity = graph.Tensors(j), graph.Tensors(j).Sparsity()
            visit(len(tensor.Name() or b"") + 4 * tensor.VariantTensorsLength()
                  + (4 * sparsity.DimMetadataLength() if sparsity else 0))
    for i in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(i)
        visit(4 * (signature.InputsLength() + signature.OutputsLength()) + len(signature.SignatureKey() or b""))
        for entry in [*map(signature.Inputs, range(signature.InputsLength())),
                      *map(signature.Outputs, range(signature.OutputsLength()))]:
            visit(len(entry.Name() or b""))


def metadata_entry(model_content: bytes, name: str) -> bytes | None:
    """The bytes of the file's metadata entry ``name`` (None: it has none),
    read without unpacking the file. Two entries of that name (readers
    differ in which they take), one over MAX_METADATA_BYTES or one naming a
    buffer the file lacks are refused."""
    _check_identifier(model_content)
    try:
        model = schema_module().Model.GetRootAs(model_content, 0)
        buffers = [model.Metadata(i).Buffer() for i in range(model.MetadataLength())
                   if model.Metadata(i).Name() == name.encode()]
        if not buffers:
            return None
        if len(buffers) > 1:
            raise EdgevitError(f"The file has {len(buffers)} {name} entries; readers differ in which they take.")
        if not 0 <= buffers[0] < model.BuffersLength():
            raise EdgevitError(f"The {name} entry names buffer {buffers[0]}, which the file does not have.")
        buffer = model.Buffers(buffers[0])
        if buffer.DataLength() > MAX_METADATA_BYTES:
            raise EdgevitError(f"The {name} entry is {buffer.DataLength():,} bytes, beyond the "
                               f"{MAX_METADATA_BYTES:,} a metadata entry may take.")
        return buffer.DataAsNumpy().tobytes() if buffer.DataLength() else b""
    except EdgevitError:
        raise
    except Exception as err:
        raise _damaged(model_content, err) from None


def write_model(model, size_hint: int) -> bytes:
    """A ``ModelT`` (edited in the object API) as .tflite bytes; ``size_hint``:
    about how many bytes it packs to."""
    import flatbuffers

    builder = flatbuffers.Builder(size_hint)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def with_metadata(model_content: bytes, name: str, data: bytes) -> bytes:
    """The flatbuffer of ``model_content`` (without anything appended to it)
    with its metadata entry ``name`` holding ``data``, added or replaced."""
    schema = schema_module()
    model = read_model(model_content)
    entry = next((e for e in model.metadata or [] if metadata_name(e) == name), None)
    if entry is None:
        model.buffers = [*(model.buffers or []), schema.BufferT()]
        entry = schema.MetadataT()
        entry.name = name
        entry.buffer = len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), entry]
    model.buffers[entry.buffer].data = np.frombuffer(data, dtype=np.uint8)
    return write_model(model, len(model_content) + len(data) + 1024)


def metadata_name(entry) -> str:
    """The name of an unpacked metadata entry (``MetadataT``)."""
    return entry.name.decode() if isinstance(entry.name, bytes) else entry.name


def add_opcode(model, op_names: list[str], name: str, version: int = 1) -> int:
    """The index of builtin op ``name``'s operator code in ``model``
    (``ModelT``), added when the file has none; ``op_names`` is
    :func:`opcode_names` of the model and grows with it."""
    if name in op_names:
        return op_names.index(name)
    schema = schema_module()
    code = schema.OperatorCodeT()
    builtin = getattr(schema.BuiltinOperator, name)
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    op_names.append(name)
    return len(op_names) - 1


def add_tensor(model, graph, name: str, shape: list[int], tensor_type: int, quantization=None,
               data: np.ndarray | None = None) -> int:
    """A new tensor of ``graph`` (``SubGraphT``), a constant when ``data`` is
    given; returns its index."""
    schema = schema_module()
    tensor = schema.TensorT()
    tensor.name, tensor.shape, tensor.type, tensor.quantization = name, list(shape), tensor_type, quantization
    tensor.buffer = 0
    if data is not None:
        buffer = schema.BufferT()
        buffer.data = np.ascontiguousarray(data).view(np.uint8).ravel()
        model.buffers.append(buffer)
        tensor.buffer = len(model.buffers) - 1
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def new_reshape(model, graph, op_names: list[str], index: int, shape: list[int], output: int | None = None):
    """A RESHAPE (not yet placed in the graph's operators) of tensor ``index``
    to ``shape``, writing ``output`` or a new tensor with ``index``'s type and
    quantization."""
    schema = schema_module()
    source = graph.tensors[index]
    if output is None:
        output = add_tensor(model, graph, tensor_name(source) + "/rank", shape, source.type, source.quantization)
    new_shape = add_tensor(model, graph, tensor_name(source) + "/rank_shape", [len(shape)],
                           schema.TensorType.INT32, data=np.asarray(shape, dtype="<i4"))
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    op = schema.OperatorT()
    op.opcodeIndex = add_opcode(model, op_names, "RESHAPE")
    op.inputs, op.outputs = [index, new_shape], [output]
    op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.ReshapeOptions, options
    return op


def constant_values(model, tensor) -> np.ndarray:
    """The values of constant ``tensor`` (``TensorT``) whose bytes ``model``
    (``ModelT``) holds inline, in the tensor's own type."""
    dtype = _DTYPES[_enum_names(schema_module().TensorType)[tensor.type]]
    return np.frombuffer(bytes(bytearray(model.buffers[tensor.buffer].data)), dtype=dtype)


def tensor_name(tensor) -> str:
    """The name of an unpacked tensor (``TensorT``)."""
    return tensor.name.decode() if isinstance(tensor.name, bytes) else (tensor.name or "")


def opcode_names(model) -> list[str]:
    """The builtin op name of each of ``model``'s operator codes (``ModelT``)."""
    names = _enum_names(schema_module().BuiltinOperator)
    return [names.get(builtin, f"BUILTIN_{builtin}")
            for builtin in (max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))
                            for code in model.operatorCodes or [])]


def operator_links(graph) -> tuple[dict, dict]:
    """For an unpacked subgraph (``SubGraphT``): tensor index -> the
    operator writing it, and tensor index -> the operators reading it."""
    producer = {int(t): op for op in graph.operators or [] for t in op.outputs}
    readers: dict[int, list] = {}
    for op in graph.operators or []:
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(int(t), []).append(op)
    return producer, readers


def holds_data(model, tensor) -> bool:
    """Whether ``tensor`` (``TensorT``) is a constant: its buffer has bytes,
    inline or at an offset past the flatbuffer."""
    buffer = model.buffers[tensor.buffer] if tensor.buffer is not None and tensor.buffer < len(model.buffers or []) \
        else None
    return buffer is not None and ((buffer.data is not None and len(buffer.data) > 0)
                                   or (getattr(buffer, "offset", 0) or 0) > 1)


def read(model_content: bytes, subgraph: int = 0) -> Graph:
    """Operators of ``subgraph`` (0: the main graph) in execution order."""
    schema = schema_module()
    model = read_model(model_content)
    if not model.subgraphs:
        raise EdgevitError("The .tflite file has no subgraph.")
    type_names = _enum_names(schema.TensorType)
    graph = model.subgraphs[subgraph]
    buffers = model.buffers or []

    tensors: list[Tensor] = []
    for index, t in enumerate(graph.tensors or []):
        dtype = type_names.get(t.type, str(t.type))
        buffer = buffers[t.buffer] if t.buffer is not None and t.buffer < len(buffers) else None
        has_data = holds_data(model, t)
        data = None
        if has_data and buffer.data is not None and dtype in _DTYPES and len(buffer.data) <= 4096:
            data = np.frombuffer(bytes(bytearray(buffer.data)), dtype=_DTYPES[dtype])
        q = t.quantization
        scale = zero_point = None
        if q is not None and q.scale is not None and len(q.scale):
            scale = float(q.scale[0])
            zero_point = int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
        name = t.name.decode() if isinstance(t.name, bytes) else (t.name or "")
        shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
        signature = tuple(int(d) for d in t.shapeSignature) if t.shapeSignature is not None else None
        tensors.append(Tensor(index, name, dtype.lower(), shape, bool(has_data), scale, zero_point, data,
                              signature))

    folded_ops, names = set(), opcode_names(model)
    for index, op in enumerate(graph.operators or []):
        ins = [int(i) for i in (op.inputs if op.inputs is not None else [])]
        if names[op.opcodeIndex] == "DEQUANTIZE" and len(ins) == 1 and ins[0] >= 0 and \
                tensors[ins[0]].is_const and tensors[ins[0]].dtype == "float16":
            folded_ops.add(index)
            for o in op.outputs:
                tensors[int(o)] = replace(tensors[int(o)], is_const=True)

    ops, consumers, producers = [], {}, {}
    for index, op in enumerate(graph.operators or []):
        code = model.operatorCodes[op.opcodeIndex]
        name = names[op.opcodeIndex]
        custom = name == "CUSTOM"
        if custom:
            raw = code.customCode
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
        inputs = [tensors[int(i)] if int(i) >= 0 else None for i in (op.inputs if op.inputs is not None else [])]
        outputs = [tensors[int(i)] for i in (op.outputs if op.outputs is not None else []) if int(i) >= 0]
        ops.append(Op(index, name, int(code.version or 1), inputs, outputs, _options(op.builtinOptions), custom))
        for t in inputs:
            if t is not None:
                consumers.setdefault(t.index, []).append(index)
        for t in outputs:
            producers[t.index] = index
    return Graph(ops=ops, tensors=tensors, inputs=[int(i) for i in graph.inputs],
                 outputs=[int(i) for i in graph.outputs], consumers=consumers, producers=producers,
                 folded_ops=folded_ops)

