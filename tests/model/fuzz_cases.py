"""Seeded mutations of valid models, for the fuzz test: every way a model file can be broken that
an audit found, and random ones (protobuf field corruption, truncation, byte flips)."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def with_initializers(proto: onnx.ModelProto) -> onnx.ModelProto:
    m = copy.deepcopy(proto)
    keep = []
    for node in m.graph.node:
        if node.op_type == "Constant":
            tensor = copy.deepcopy(node.attribute[0].t)
            tensor.name = node.output[0]
            m.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    for i, node in enumerate(m.graph.node):
        node.name = f"{node.op_type}_{i}"
    return m


def mlp(rng: np.random.Generator) -> onnx.ModelProto:
    """x -> MatMul+Add -> Relu -> Gemm -> y, with random sizes."""
    k, h, n = (int(v) for v in rng.integers(2, 9, size=3))
    inits = [numpy_helper.from_array(rng.standard_normal((k, h)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((n, h)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm"),
             helper.make_node("Add", ["h0", "b1"], ["h1"], name="add"),
             helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
             helper.make_node("Gemm", ["h2", "w2", "b2"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


DTYPES = [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 19, 21, 23, 40, 999]


def _tensors(m: onnx.ModelProto):
    out = list(m.graph.initializer)
    out += [a.t for n in m.graph.node for a in n.attribute if a.HasField("t")]
    return out


def _values(m: onnx.ModelProto) -> list[str]:
    names = [v.name for v in m.graph.input] + [t.name for t in m.graph.initializer]
    return names + [o for n in m.graph.node for o in n.output]


def mutate(proto: onnx.ModelProto, rng: np.random.Generator, contract: str | None = None):
    """One mutation of ``proto``: (description, model bytes)."""
    m = copy.deepcopy(proto)
    nodes = m.graph.node
    kind = str(rng.choice(KINDS))
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    if kind == "drop node" and len(nodes):
        del nodes[int(rng.integers(len(nodes)))]
    elif kind == "duplicate node" and len(nodes):
        nodes.append(copy.deepcopy(pick(nodes)))
    elif kind == "drop initializer" and len(m.graph.initializer):
        del m.graph.initializer[int(rng.integers(len(m.graph.initializer)))]
    elif kind == "duplicate initializer" and len(m.graph.initializer):
        twin = copy.deepcopy(pick(m.graph.initializer))
        m.graph.initializer.append(twin)
    elif kind == "rename node to collide" and len(nodes) > 1:
        pick(nodes).name = pick(nodes).name or "n"
    elif kind == "rename output to collide" and len(nodes):
        node = pick(nodes)
        node.output[0] = pick(_values(m))
    elif kind == "rewire to make a cycle" and len(nodes) > 1:
        i = int(rng.integers(len(nodes) - 1))
        j = int(rng.integers(i + 1, len(nodes)))
        if len(nodes[i].input):
            nodes[i].input[0] = nodes[j].output[0]
    elif kind == "garble attribute":
        attrs = [a for n in nodes for a in n.attribute]
        if attrs:
            a = pick(attrs)
            choice = int(rng.integers(5))
            if choice == 0:
                a.type = int(rng.integers(0, 15))
            elif choice == 1:
                a.ClearField("ints")
                a.ints.extend(int(v) for v in rng.integers(-3, 5, size=int(rng.integers(0, 5))))
            elif choice == 2:
                a.name = pick(["axis", "group", "pads", "", "bogus", "kernel_shape"])
            elif choice == 3:
                a.i = int(rng.integers(-5, 10**6))
            else:
                a.ref_attr_name = "outer"
    elif kind == "weird dtype":
        tensors = _tensors(m)
        if tensors:
            pick(tensors).data_type = int(pick(DTYPES))
    elif kind == "wrong dims":
        tensors = _tensors(m)
        if tensors:
            t = pick(tensors)
            t.ClearField("dims")
            t.dims.extend(int(v) for v in rng.integers(0, 6, size=int(rng.integers(0, 4))))
    elif kind == "non-finite weight":
        floats = [t for t in _tensors(m) if t.data_type == TensorProto.FLOAT]
        if floats:
            t = pick(floats)
            a = numpy_helper.to_array(t).copy()
            if a.size:
                a.flat[int(rng.integers(a.size))] = pick([np.inf, -np.inf, np.nan])
                t.CopyFrom(numpy_helper.from_array(a, t.name))
    elif kind == "input type":
        v = pick(list(m.graph.input))
        v.type.tensor_type.elem_type = int(pick(DTYPES))
    elif kind == "input shape":
        v = pick(list(m.graph.input))
        dims = v.type.tensor_type.shape.dim
        if len(dims):
            d = pick(dims)
            d.dim_value = int(rng.integers(-2, 4))
    elif kind == "drop outputs":
        del m.graph.output[:]
    elif kind == "opset":
        m.opset_import[0].version = int(rng.integers(-1, 30))
    elif kind == "ir version":
        m.ir_version = int(rng.integers(-1, 20))
    elif kind == "domain" and len(nodes):
        pick(nodes).domain = pick(["com.microsoft", "qtool", "ai.onnx.ml", "x.y", "ai.onnx.preview.training"])
    elif kind == "op type" and len(nodes):
        pick(nodes).op_type = pick(["Conv", "Gemm", "MatMul", "BatchNormalization", "Relu", "Nope", "Add", "Loop"])
    elif kind == "input count" and len(nodes):
        node = pick(nodes)
        if rng.integers(2) and len(node.input):
            del node.input[-1]
        else:
            node.input.append(pick(_values(m) + [""]))
    elif kind == "garbled metadata":
        text = contract if contract is not None and rng.integers(2) else json.dumps({"version": 1})
        doc = json.loads(text)
        target = doc
        while isinstance(target, (dict, list)) and target and rng.integers(3):  # sometimes a nested entry
            inner = target[pick(sorted(target))] if isinstance(target, dict) else pick(target)
            if not isinstance(inner, (dict, list)) or not inner:
                break
            target = inner
        junk = [None, 1, "x", [], {}, [1, "a"], {"a": 1}, -1.5, "Conv_0/act_quant/min", "input", True]
        if isinstance(target, dict) and target:
            key = pick(sorted(target))
            if rng.integers(4):
                target[key] = pick(junk)
            else:
                del target[key]
        elif isinstance(target, list) and target:
            target[int(rng.integers(len(target)))] = pick(junk)
        entry = m.metadata_props.add()
        entry.key, entry.value = "qtool.training", json.dumps(doc) if rng.integers(4) else text[: len(text) // 2]
    elif kind == "sparse":
        floats = [t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims)]
        if floats:
            t = pick(floats)
            a = numpy_helper.to_array(t).reshape(-1)
            idx = np.sort(rng.choice(a.size, size=int(rng.integers(0, a.size + 1)), replace=False)).astype(np.int64)
            if rng.integers(3) == 0 and idx.size:
                idx[-1] = a.size + int(rng.integers(0, 5))
            sparse = helper.make_sparse_tensor(numpy_helper.from_array(a[np.minimum(idx, a.size - 1)], t.name),
                                               numpy_helper.from_array(idx, ""), list(t.dims))
            m.graph.initializer.remove(t)
            m.graph.sparse_initializer.append(sparse)
    data = m.SerializeToString()
    if kind == "truncate bytes":
        data = data[: int(rng.integers(0, len(data)))]
    elif kind == "flip bytes":
        raw = bytearray(data)
        for _ in range(int(rng.integers(1, 8))):
            raw[int(rng.integers(len(raw)))] = int(rng.integers(256))
        data = bytes(raw)
    elif kind == "field corruption":
        data = _corrupt_field(m, rng)
    return kind, data


def _corrupt_field(m: onnx.ModelProto, rng: np.random.Generator) -> bytes:
    """Set one scalar field somewhere in the message tree to a random value of its type."""
    messages = [m]
    found = []
    while messages:
        msg = messages.pop()
        for field, value in msg.ListFields():
            if field.type == field.TYPE_MESSAGE:
                items = value if field.is_repeated else [value]
                messages.extend(items)
            elif not field.is_repeated:
                found.append((msg, field))
    if not found:
        return m.SerializeToString()
    msg, field = found[int(rng.integers(len(found)))]
    if field.type == field.TYPE_STRING:
        setattr(msg, field.name, str(rng.choice(["", "x", "conv1.weight", "input", "Conv_0", "qtool", "a/b"])))
    elif field.type == field.TYPE_BYTES:
        setattr(msg, field.name, bytes(rng.integers(0, 256, size=int(rng.integers(0, 16)), dtype=np.uint8)))
    elif field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        setattr(msg, field.name, float(rng.choice([0.0, -1.0, 1e30, np.inf, np.nan])))
    elif field.type == field.TYPE_BOOL:
        setattr(msg, field.name, not getattr(msg, field.name))
    elif field.type == field.TYPE_ENUM:
        setattr(msg, field.name, int(rng.choice([v.number for v in field.enum_type.values])))
    else:
        bits = 32 if field.type in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32) else 63
        unsigned = field.type in (field.TYPE_UINT32, field.TYPE_UINT64, field.TYPE_FIXED32, field.TYPE_FIXED64)
        low = 0 if unsigned else -(2 ** (bits - 1))
        setattr(msg, field.name, int(rng.choice([low, -1 if not unsigned else 0, 0, 1, 7, 2 ** (bits - 1) - 1])))
    return m.SerializeToString()


KINDS = ["drop node", "duplicate node", "drop initializer", "duplicate initializer", "rename node to collide",
         "rename output to collide", "rewire to make a cycle", "garble attribute", "weird dtype", "wrong dims",
         "non-finite weight", "input type", "input shape", "drop outputs", "opset", "ir version", "domain",
         "op type", "input count", "garbled metadata", "sparse", "truncate bytes", "flip bytes",
         "field corruption"]
