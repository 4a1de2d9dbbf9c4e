"""Names: stable names for unnamed nodes, unique names for inserted ones.

Exporters often leave nodes unnamed. qtool names them ``<OpType>_<k>``
(``k`` counts nodes of that op type in graph order), so the report and
``--exclude`` can refer to them and a rerun gives the same names; a name
repeated by later nodes stays on the first, the others become ``<name>_<k>``. Inserted
nodes and tensors are named after where they came from, TensorFlow style:
``<context>/weights_quant/DequantizeLinear`` where the context is the layer
node's name without its last ``/`` component (``/conv1/Conv`` -> ``/conv1``),
or the whole name when it has no ``/``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import onnx_ir as ir


def name_unnamed_nodes(graph: ir.Graph) -> int:
    """Give every unnamed node (subgraphs' included) a stable name, and a node whose name an earlier node already
    has ``<name>_<k>`` (ONNX wants node names unique; onnx.checker and onnxruntime accept repeats, and
    exporters write them: spox names many ``Constant`` nodes ``F0::anon``); returns how many were named."""
    used = {node.name for node in graph.all_nodes() if node.name}
    seen: set[str] = set()
    unnamed: Counter[str] = Counter()
    repeated: Counter[str] = Counter()
    named = 0
    for node in graph.all_nodes():  # If/Loop/Scan bodies too: their layers are reported and quantized by name
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base, counters, first = (node.name, repeated, 1) if node.name else (node.op_type, unnamed, 0)
        while True:
            candidate = f"{base}_{counters[base] + first}"
            counters[base] += 1
            if candidate not in used:
                break
        node.name = candidate
        used.add(candidate)
        seen.add(candidate)
        named += 1
    return named


def context_of(name: str) -> str:
    """TensorFlow's context of an op name: everything before the last ``/``.

    Names without a ``/`` (generated ``Conv_3``, or a plain ``conv1``) are their
    own context, so ``conv1`` gives ``conv1/weights_quant/...``.
    """
    head, sep, _ = name.rpartition("/")
    if sep and head:
        return head
    return name


class NameScope:
    """Hands out node and value names that are unique in the model."""

    def __init__(self, graph: ir.Graph):
        self._nodes: set[str] = set()
        self._values: set[str] = set()
        self.reserve_graph(graph)

    def reserve_graph(self, graph: ir.Graph) -> None:
        """Every name ``graph`` uses now (its subgraphs' too) is taken: for a graph that grew after the scope
        was made (If branches encoded for training, their state moved up)."""
        for scope in (graph, *graph.subgraphs()):
            self._values.update(value.name for value in scope.inputs if value.name)
            self._values.update(scope.initializers)
        for node in graph.all_nodes():
            if node.name:
                self._nodes.add(node.name)
            for value in node.outputs:
                if value.name:
                    self._values.add(value.name)

    @staticmethod
    def _unique(base: str, used: set[str]) -> str:
        name = NameScope.fresh(base, used)
        used.add(name)
        return name

    @staticmethod
    def fresh(base: str, used: set[str]) -> str:
        """``base``, or ``base_k`` with the first k that is not in ``used``."""
        name = base
        k = 1
        while name in used:
            name = f"{base}_{k}"
            k += 1
        return name

    def node(self, base: str) -> str:
        return self._unique(base, self._nodes)

    def value(self, base: str) -> str:
        return self._unique(base, self._values)

    def reserve_value(self, name: str) -> None:
        self._values.add(name)

    def prefix(self, base: str, nodes: Sequence[str] = (), values: Sequence[str] = ()) -> str:
        """A prefix ``base`` (or ``base_k``) under which all the given names are free.

        Reserves ``prefix/<name>`` for each node and value name, so the parts
        of one quantizer always share one prefix.
        """
        k = 0
        while True:
            candidate = base if k == 0 else f"{base}_{k}"
            node_names = [f"{candidate}/{n}" for n in nodes]
            value_names = [f"{candidate}/{v}" for v in values]
            if not any(n in self._nodes for n in node_names) and not any(v in self._values for v in value_names):
                self._nodes.update(node_names)
                self._values.update(value_names)
                return candidate
            k += 1
