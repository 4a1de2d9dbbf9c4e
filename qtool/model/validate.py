"""What an input model must be before qtool touches it.

Two stages, both called by :func:`qtool.model.io.load_model` (and for an
``onnx.ModelProto`` given to the API):

- :func:`check_proto` on the parsed protobuf, before it becomes IR: names are
  unique (initializers, graph inputs, values: ONNX's namespaces; repeated node
  names, which only label nodes, are made unique by
  :func:`qtool.model.names.name_unnamed_nodes`), every attribute
  has a type, the graph has no cycle. Sparse initializers (valid ONNX, which
  the IR does not carry) become dense ones (:func:`densify_sparse`).
- on the IR: a graph that is acyclic but not in topological order is
  sorted (:func:`sort_graphs`); ``onnx.checker`` runs on a light copy (big
  tensors as placeholders, so nothing is read from external data and no
  2 GB limit applies: :func:`run_checker`); the weights and biases of layers and the parameters
  of batch norms are finite (a NaN or inf there quantizes into garbage
  without any error later: :func:`check_finite_parameters`).

Every refusal is a :class:`~qtool.errors.QtoolError` naming the node and
tensor at fault.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir

from qtool.errors import QtoolError
from qtool.model.constants import constant_source, root_array
from qtool.model.layers import BIAS_INPUT, WEIGHT_INPUT, is_layer

BATCH_NORM_PARAMETERS = {1: "scale", 2: "bias", 3: "running mean", 4: "running variance"}
_CHUNK = 1 << 24  # elements per finiteness check (bounded temporary memory on big tensors)
PLACEHOLDER = "__qtool_placeholder__"  # the external data location of the light copy's tensors


# --- the protobuf ------------------------------------------------------------------------------------
def _graph_label(graph: onnx.GraphProto, where: str) -> str:
    return where if not graph.name else f"{where} '{graph.name}'"


def check_proto(proto: onnx.ModelProto, label: str) -> None:
    """Text fields, names, types and cycles of ``proto`` (every graph, subgraphs included)."""
    _check_text(proto, label)
    _check_graph_proto(proto.graph, label, "the graph", outer=set())
    for function in proto.functions:
        for node in function.node:
            _check_attributes(node, label)


def _check_text(message, label: str) -> None:
    """Every ``string`` field holds UTF-8 text (protobuf parses bytes that are not, and they fail
    later, when the model is written)."""
    stack = [message]
    while stack:
        msg = stack.pop()
        for field, value in msg.ListFields():
            if field.type == field.TYPE_MESSAGE:
                if field.is_repeated:
                    stack.extend(value)
                else:
                    stack.append(value)
            elif field.type == field.TYPE_STRING:
                for text in (value if field.is_repeated else [value]):
                    if not isinstance(text, str):
                        name = getattr(msg, "name", "") if field.name != "name" else ""
                        where = f" of {type(msg).__name__.removesuffix('Proto')} '{name}'" if name else ""
                        raise QtoolError(f"'{label}' is not a valid ONNX model: the field '{field.name}'{where} "
                                         f"is not UTF-8 text ({bytes(text)[:40]!r})")


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


_DATA_TYPES = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}


_T = onnx.TensorProto
# the typed field of each data type, and how many entries it holds per element (4-bit types: two per entry)
_FIELDS = {_T.FLOAT: ("float_data", 1), _T.COMPLEX64: ("float_data", 2), _T.DOUBLE: ("double_data", 1),
           _T.COMPLEX128: ("double_data", 2), _T.INT64: ("int64_data", 1), _T.UINT32: ("uint64_data", 1),
           _T.UINT64: ("uint64_data", 1), _T.STRING: ("string_data", 1)}
_FOUR_BIT = {getattr(_T, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(_T, n)}


def _check_tensor_type(tensor: onnx.TensorProto, what: str, label: str) -> None:
    """A defined data type, and as much data as the dims say (inline tensors; external ones are
    checked against their file when loaded)."""
    if tensor.data_type not in _DATA_TYPES:
        kind = "no data type (UNDEFINED)" if tensor.data_type == 0 else f"an unknown data type ({tensor.data_type})"
        raise QtoolError(f"'{label}' is not a valid ONNX model: {what} has {kind}")
    if any(d < 0 for d in tensor.dims):
        raise QtoolError(f"'{label}' is not a valid ONNX model: {what} has a negative dimension {list(tensor.dims)}")
    if tensor.data_location == _T.EXTERNAL or tensor.data_type == _T.STRING and not tensor.dims:
        return
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.HasField("raw_data"):
        bits = ir.DataType(tensor.data_type).bitwidth if tensor.data_type != _T.STRING else None
        have, need = len(tensor.raw_data), None if bits is None else -(-count * bits // 8)
        unit = "bytes"
    else:
        field, per = _FIELDS.get(tensor.data_type, ("int32_data", 1))
        have = len(getattr(tensor, field))
        need = -(-count // 2) if tensor.data_type in _FOUR_BIT else count * per
        unit = f"values in {field}"
    if need is not None and have != need:
        raise QtoolError(f"'{label}' is not a valid ONNX model: {what} of shape {list(tensor.dims)} "
                         f"needs {need} {unit}, it has {have}")


def _check_attributes(node: onnx.NodeProto, label: str) -> None:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.UNDEFINED and not attr.ref_attr_name:
            raise QtoolError(f"'{label}' is not a valid ONNX model: attribute '{attr.name}' of node "
                             f"'{node.name or node.op_type}' has no type (UNDEFINED)")
        where = f"tensor attribute '{attr.name}' of node '{node.name or node.op_type}'"
        # the tensor field the type names (the IR reads it whether it is set or not)
        tensors = [attr.t] if attr.HasField("t") or attr.type == onnx.AttributeProto.TENSOR else []
        for tensor in tensors + list(attr.tensors):
            _check_tensor_type(tensor, where, label)


def _check_graph_proto(graph: onnx.GraphProto, label: str, where: str, outer: set[str]) -> None:
    where = _graph_label(graph, where)

    def duplicate(names, what: str) -> None:
        counts = Counter(n for n in names if n)
        twice = [n for n, c in counts.items() if c > 1]
        if twice:
            raise QtoolError(f"'{label}' is not a valid ONNX model: {what} '{twice[0]}' appears "
                             f"{counts[twice[0]]} times in {where} (names must be unique)")

    duplicate([t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer],
              "initializer name")
    for tensor in list(graph.initializer) + [s.values for s in graph.sparse_initializer]:
        _check_tensor_type(tensor, f"initializer '{tensor.name}'", label)
    duplicate([v.name for v in graph.input], "graph input")
    # values: each is defined once (a graph input that is also an initializer is IR < 4 style and fine)
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        _check_attributes(node, label)
        for out in node.output:
            if not out:
                continue
            if out in producer or out in defined:
                first = producer.get(out)
                what = f"node '{first.name or first.op_type}'" if first is not None else "a graph input or initializer"
                raise QtoolError(f"'{label}' is not a valid ONNX model: tensor '{out}' is written by node "
                                 f"'{node.name or node.op_type}' and by {what} in {where} "
                                 "(each tensor must have one definition)")
            producer[out] = node
    _check_acyclic(graph, producer, label, where)
    inner_outer = outer | defined | set(producer)
    for node in graph.node:
        for sub in _subgraphs(node):
            _check_graph_proto(sub, label, f"a subgraph of node '{node.name or node.op_type}'", inner_outer)


def _check_acyclic(graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto], label: str, where: str) -> None:
    """Kahn's algorithm over the nodes (edges through subgraphs' outer-scope reads included)."""
    nodes = list(graph.node)
    index = {id(n): i for i, n in enumerate(nodes)}
    readers: dict[int, list[int]] = {}
    pending = [0] * len(nodes)
    for i, node in enumerate(nodes):
        reads = set(node.input)
        for sub in _subgraphs(node):
            reads |= _outer_reads(sub)
        for name in reads:
            p = producer.get(name)
            if p is not None:
                readers.setdefault(index[id(p)], []).append(i)
                pending[i] += 1
    ready = [i for i, c in enumerate(pending) if c == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in readers.get(i, ()):
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(j)
    if done < len(nodes):
        stuck = [nodes[i] for i, c in enumerate(pending) if c > 0]
        names = ", ".join(f"'{n.name or n.op_type}'" for n in stuck[:4]) + (" ..." if len(stuck) > 4 else "")
        raise QtoolError(f"'{label}' is not a valid ONNX model: {where} has a cycle through node(s) {names}")


def tensor_protos(proto: onnx.ModelProto):
    """Every TensorProto of a model: initializers, sparse initializers, tensor attributes, in every
    graph and function."""
    def graph_tensors(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node):
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for g in attr.graphs:
                yield from graph_tensors(g)

    yield from graph_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from node_tensors(node)


def _graph_protos(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graph_protos(sub)


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads that it does not define (read from the enclosing scopes)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    reads = set()
    for node in graph.node:
        reads.update(n for n in node.input if n)
        for sub in _subgraphs(node):
            reads |= _outer_reads(sub)
        defined.update(node.output)
    return reads - defined


def densify_sparse(proto: onnx.ModelProto, label: str) -> int:
    """Turn the sparse initializers of the main graph into dense ones, in place; returns how many."""
    graph = proto.graph
    count = 0
    for sparse in graph.sparse_initializer:
        name = sparse.values.name
        if sparse.values.data_location == onnx.TensorProto.EXTERNAL or \
                sparse.indices.data_location == onnx.TensorProto.EXTERNAL:
            raise QtoolError(f"'{label}': sparse initializer '{name}' keeps its values in external data, "
                             "which qtool cannot read; store it as a dense initializer")
        try:
            dense = _dense(sparse)
        except (ValueError, TypeError, IndexError) as exc:
            raise QtoolError(f"'{label}' is not a valid ONNX model: sparse initializer '{name}' is malformed "
                             f"({exc})") from exc
        tensor = onnx.numpy_helper.from_array(dense, name)
        if sparse.values.data_type == onnx.TensorProto.BFLOAT16 or dense.dtype == object:
            raise QtoolError(f"'{label}': sparse initializer '{name}' has a data type qtool cannot densify")
        graph.initializer.append(tensor)
        count += 1
    if count:
        del graph.sparse_initializer[:]
    return count


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = onnx.numpy_helper.to_array(sparse.values)
    indices = onnx.numpy_helper.to_array(sparse.indices).astype(np.int64)
    shape = tuple(int(d) for d in sparse.dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in {list(shape)}")
    size = int(np.prod(shape, dtype=np.int64))
    dense = np.zeros(size, dtype=values.dtype)
    nnz = values.size
    if indices.ndim == 1:
        flat = indices
    elif indices.ndim == 2 and indices.shape[1] == len(shape):
        flat = np.ravel_multi_index(tuple(indices.T), shape) if nnz else np.zeros(0, np.int64)
    else:
        raise ValueError(f"indices of shape {list(indices.shape)} do not index a tensor of shape {list(shape)}")
    if flat.shape[0] != nnz:
        raise ValueError(f"{flat.shape[0]} indices for {nnz} values")
    if nnz and (flat.min() < 0 or flat.max() >= size):
        raise ValueError(f"an index is outside the tensor of shape {list(shape)}")
    dense[flat] = values.reshape(-1)
    return dense.reshape(shape)


# --- the IR -------------------------------------------------------------------------------------------
def sort_graphs(model: ir.Model) -> bool:
    """Put every graph of ``model`` in topological order (ONNX requires it; some tools do not
    write it). The graphs are known to be acyclic (:func:`check_proto`). True if one was sorted."""
    changed = False
    for graph in model.graphs():
        if not _is_sorted(graph):
            graph.sort()
            changed = True
    return changed


def _is_sorted(graph: ir.Graph) -> bool:
    seen: set[int] = set()
    for node in graph:
        for value in node.inputs:
            if value is None:
                continue
            producer = value.producer()
            if producer is not None and producer.graph is graph and id(producer) not in seen:
                return False
        seen.add(id(node))
    return True


def run_checker(proto: onnx.ModelProto, label: str) -> None:
    """``onnx.checker`` on ``proto``: a light copy of the model (``qtool.model.io.light_proto``)
    whose big tensors are external-data placeholders.

    ``proto`` is a throwaway copy and is edited: graph inputs and outputs without a shape
    (valid, and common: unknown rank) get an empty one, which the checker insists on.
    """
    for graph in _graph_protos(proto.graph):
        for info in list(graph.input) + list(graph.output):
            if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape"):
                info.type.tensor_type.shape.SetInParent()
    for tensor in tensor_protos(proto):  # external tensors not in initializers (Constant nodes)
        if tensor.data_location == _T.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = PLACEHOLDER
    try:
        with tempfile.TemporaryDirectory(prefix="qtool-check-") as folder:
            # the placeholders name an (empty) file, as the checker wants external data to exist
            open(os.path.join(folder, PLACEHOLDER), "wb").close()
            path = os.path.join(folder, "model.onnx")
            with open(path, "wb") as f:
                f.write(proto.SerializeToString())
            _check_file(path, label)
    except OSError as exc:
        raise QtoolError(f"cannot check '{label}': the temporary folder for onnx.checker cannot be written "
                         f"({exc.strerror or exc}); set TMPDIR to a writable folder") from exc


def _check_file(path: str, label: str) -> None:
    try:
        onnx.checker.check_model(path, full_check=False)
    except onnx.checker.ValidationError as exc:
        main, _, context = str(exc).partition("==> Context:")
        text = " ".join(main.split()) + (f" [{' '.join(context.split())}]" if context.strip() else "")
        raise QtoolError(f"'{label}' is not a valid ONNX model: {text}") from exc


def check_finite_parameters(graph: ir.Graph, label: str) -> None:
    """Layer weights and biases and batch-norm parameters hold no NaN or inf, and running
    variances are not negative."""
    for node in graph.all_nodes():
        if node.domain != "":
            continue
        checks = []
        if is_layer(node):
            for what, table in (("weight", WEIGHT_INPUT), ("bias", BIAS_INPUT)):
                index = table.get(node.op_type)
                if index is not None and index < len(node.inputs):
                    checks.append((what, node.inputs[index]))
        elif node.op_type == "BatchNormalization":
            checks = [(what, node.inputs[i]) for i, what in BATCH_NORM_PARAMETERS.items() if i < len(node.inputs)]
            eps = node.attributes.get("epsilon")
            if eps is not None and eps.type == ir.AttributeType.FLOAT and not (np.isfinite(eps.as_float())
                                                                              and eps.as_float() >= 0):
                raise QtoolError(f"'{label}': BatchNormalization '{node.name}' has epsilon {eps.as_float()}; "
                                 "it must be a finite number >= 0")
        for what, value in checks:
            source = constant_source(value)
            if source is None:
                continue
            try:
                array = root_array(source.root)
            except Exception as exc:  # noqa: BLE001 - a tensor whose bytes do not match its type
                raise QtoolError(f"'{label}': the {what} '{value.name}' of {node.op_type} "
                                 f"'{node.name}' cannot be read ({exc})") from exc
            bad = _first_non_finite(array)
            if bad is None and what == "running variance" and array is not None and np.asarray(array).size:
                negative = np.asarray(array) < 0
                if negative.any():
                    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(negative)), negative.shape))
                    raise QtoolError(
                        f"'{label}': the running variance '{value.name}' of BatchNormalization '{node.name}' "
                        f"has {int(negative.sum())} negative value(s) (first: {np.asarray(array)[index]} at index "
                        f"{index}); a variance cannot be negative"
                    )
            if bad is not None:
                index, number, count = bad
                raise QtoolError(
                    f"'{label}': the {what} '{value.name}' of {node.op_type} '{node.name}' contains "
                    f"{count} non-finite value(s) (first: {number} at index {index}); "
                    "a model with NaN or inf parameters cannot be quantized"
                )


def _first_non_finite(array) -> tuple[tuple[int, ...], float, int] | None:
    if array is None:
        return None
    array = np.asarray(array)
    if array.dtype.kind not in "fc":
        return None
    flat = array.reshape(-1)
    first, count = None, 0
    for start in range(0, flat.size, _CHUNK):
        bad = ~np.isfinite(flat[start:start + _CHUNK])
        n = int(np.count_nonzero(bad))
        if n and first is None:
            first = start + int(np.argmax(bad))
        count += n
    if first is None:
        return None
    return tuple(int(i) for i in np.unravel_index(first, array.shape)), flat[first].item(), count
