"""Node building for the training graph: named nodes, constants, state.

New nodes are appended to the graph and the graph is sorted topologically
once at the end of the rewrite (``graph.sort()``), so builders never have to
find an insertion point. Node and value names are unique and say where they
came from (``<context>/act_quant/BatchMin``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from qtool.model.names import NameScope
from qtool.model.constants import contiguous

FLOAT = ir.DataType.FLOAT


class Ops:
    def __init__(self, graph: ir.Graph, names: NameScope, opset: int):
        self.graph = graph
        self.names = names
        self.opset = opset

    # --- values ----------------------------------------------------------------------------
    def const(self, base: str, array, dtype=np.float32) -> ir.Value:
        """A new initializer (a constant of the rewrite, not state)."""
        array = contiguous(np.asarray(array, dtype=dtype))
        name = self.names.value(base)
        value = ir.Value(name=name, const_value=ir.Tensor(array, name=name))
        self.graph.register_initializer(value)
        return value

    def state(self, name: str, array) -> ir.Value:
        """A state initializer that is also a graph input (the training loop feeds it back)."""
        array = contiguous(np.asarray(array, dtype=np.float32))
        name = self.names.value(name)
        value = ir.Value(
            name=name,
            const_value=ir.Tensor(array, name=name),
            type=ir.TensorType(FLOAT),
            shape=ir.Shape(array.shape),
        )
        self.graph.register_initializer(value)
        self.graph.inputs.append(value)
        return value

    # --- nodes ----------------------------------------------------------------------------------
    def op(self, op_type: str, inputs, base: str, attributes=None, *, domain: str = "",
           dtype: ir.DataType | None = FLOAT, shape=None) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes or {}, domain=domain, name=self.names.node(base))
        out = node.outputs[0]
        out.name = self.names.value(base)
        if dtype is not None:
            out.dtype = dtype
        if shape is not None:
            out.shape = ir.Shape(shape)
        self.graph.append(node)
        return out

    def reduce(self, op_type: str, x: ir.Value, axes, keepdims: bool, base: str) -> ir.Value:
        """ReduceMin/Max/Mean over ``axes`` (None: all), for any opset (axes an input from 18)."""
        attrs = {"keepdims": int(bool(keepdims))}
        inputs = [x]
        if axes is not None:
            if self.opset >= 18:
                inputs.append(self.const(f"{base}/axes", np.asarray(list(axes), np.int64), np.int64))
            else:
                attrs["axes"] = [int(a) for a in axes]
        return self.op(op_type, inputs, base, attrs)

    def reshape(self, x: ir.Value, shape, base: str) -> ir.Value:
        target = self.const(f"{base}/shape", np.asarray(list(shape), np.int64), np.int64)
        return self.op("Reshape", [x, target], base)
