"""simulate's attribution of an activation quantizer to a layer does not depend on where Python put the nodes
in memory: a tensor read by several layers belongs, in the report, to the first of them in graph order."""

from model_builders import Builder

import qtool
from qtool.simulate import graph as g


def test_a_tensor_read_by_several_layers_belongs_to_the_first_in_graph_order():
    b = Builder(opset=13)
    x = b.node("Relu", [b.input("x", ["N", 8])])
    outs = [b.matmul(x, 8, 8, name=f"layer{i}") for i in range(6)]
    y = outs[0]
    for other in outs[1:]:
        y = b.node("Add", [y, other])
    model = qtool.rewrite_eval(b.proto([y])).model
    quantized = g.find_quantizers(model.graph)
    first = next(n.name for n in model.graph if n.op_type == "MatMul")
    readers = {n.name for n in quantized.layers()}
    assert len(readers) == 6
    shared = [q for q, owners in g.layer_owned_quantizers(quantized).items() for q in owners]
    layer_of = g.quantizer_layers(quantized)
    (x_quant,) = {q for q in layer_of if shared.count(q) == 6}
    assert layer_of[x_quant] == first
