"""If branches in the training graph: each trains as the model it is, its state in the enclosing graph.

``rewrite-eval`` quantizes an If branch as a model of its own (:mod:`qtool.onnx_rewrite.branches`);
the training rewrite does the same with ``encode_train``, and then the branch model's training
interface moves to the enclosing graph, where a training loop feeds and reads it:

- its ``qtool_step`` and ``qtool_range_update`` inputs read the enclosing graph's (placeholders until
  the enclosing graph's encoding creates them: :func:`join_branches`);
- its state (activation ranges) becomes initializers and graph inputs of the enclosing graph; the
  enclosing weights it trains become graph inputs there (parameters);
- each ``<state>:updated`` output leaves the branch as a new output of the If (the other branch passes
  that state through unchanged) and becomes the graph output of that name;
- its contract joins the enclosing one; ``branches`` records each branch's part, so that
  ``train_graph.strip_training_graph`` turns the branches back into float graphs (``rewrite-eval`` of a
  trained graph) and gives each branch's trained ranges, named as ``rewrite-eval`` names a branch's
  ranges (``<If>:<branch>:<tensor>``).

A branch model's own If branches are encoded first (``api._encode_train`` recurses) and joined to it:
their state is then the branch model's, hoisted again by :func:`splice_trained`, through each enclosing
If to the main graph; their ``branches`` records nest in the branch's (``strip_training_graph`` strips
them in turn, their ranges named ``<If>:<branch>:<inner If>:<inner branch>:<tensor>``, as rewrite-eval's).

Pure graph edits: nothing runs here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from qtool.model.names import NameScope
from qtool.onnx_rewrite import train_graph as tg
from qtool.onnx_rewrite.branches import BRANCHES, Extracted, replace_if

UPDATE_SUFFIX = tg.UPDATED_SUFFIX


@dataclass
class TrainedBranch:
    """A branch whose training encoding moved back into its If (:func:`splice_trained`)."""

    node: ir.Node
    attribute: str
    contract: dict
    step: ir.Value  # placeholders: what the branch reads as the step and the range-update inputs
    range_update: ir.Value | None
    updates: list[tuple[str, ir.Value]] = field(default_factory=list)  # state name -> the body's updated value
    inner: list = field(default_factory=list)  # its own If branches' results (TrainedBranch or BranchResult)


def splice_trained(extracted: Extracted, contract: dict, inner: list, enclosing: ir.Graph) -> TrainedBranch:
    """Move a branch model encoded by ``encode_train`` back into its If (see the module docstring); the
    If's own outputs are added by :func:`join_branches`, once every branch is back. ``inner``: the results
    of the branch model's own If branches (theirs already joined to it: their state is the branch model's)."""
    graph = extracted.model.graph
    by_name = {v.name: v for v in graph.inputs}
    step = by_name[contract["step_input"]]
    range_update = by_name.get(contract.get("range_update_input") or "")
    owned = [v for v in graph.inputs if v.name not in extracted.inputs]  # the rest: enclosing tensors
    # the state moves to the enclosing graph; an enclosing weight trained as it is stays there (splice reads it)
    hoisted = [v for v in owned if v is not step and v is not range_update and not _enclosing_weight(extracted, v)]
    for value in owned:
        graph.inputs.remove(value)
        if value is step or value is range_update or value in hoisted:
            graph.initializers.pop(value.name, None)
    stand_ins = {id(v) for v in graph.initializers.values() if id(v) in extracted.constants}
    _rename_clashes([*hoisted, *_defined(graph, stand_ins)], contract, enclosing)
    updated = {u: s for s, u in contract["state"].items()}
    count = len(extracted.node.outputs)
    updates = []
    for value in graph.outputs[count:]:
        updates.append((updated[value.name], value))
        value.name = f"{value.name}/{extracted.attribute}"  # the If's output takes the name
    extracted.splice()
    for value in hoisted:
        enclosing.register_initializer(value)
        enclosing.inputs.append(value)
    return TrainedBranch(extracted.node, extracted.attribute, contract, step, range_update, updates, inner)


def _rename_clashes(values: list[ir.Value], contract: dict, enclosing: ir.Graph) -> None:
    """The branch's ``values`` named as a tensor of the enclosing graph (at any depth: the sibling branch
    quantizes the tensor they both read, and without data both are trained) take fresh names, in ``contract``
    too (its own branches' records included); a state's update output is renamed with it. (The names
    ``finish_branches`` would change, which the contract would then miss.)"""
    taken = _names(enclosing)
    used = taken | {v.name for v in values if v.name}
    renamed: dict[str, str] = {}
    for value in values:
        if value.name in taken and value.name not in renamed:
            renamed[value.name] = NameScope.fresh(value.name, used)
            used.add(renamed[value.name])
            if value.name in contract["state"]:
                renamed[value.name + UPDATE_SUFFIX] = renamed[value.name] + UPDATE_SUFFIX
    if not renamed:
        return
    for value in values:
        value.name = renamed.get(value.name, value.name)
    contract.update(_renamed(contract, renamed))


def _names(graph: ir.Graph) -> set[str]:
    """The tensor names of ``graph`` and of every graph nested in it."""
    return {name for g in (graph, *graph.subgraphs()) for name in tg.values_by_name(g)}


def _defined(graph: ir.Graph, skip: set[int]) -> list[ir.Value]:
    """The values ``graph`` (and every graph nested in it) defines, but for those whose ``id`` is in ``skip``
    (``graph``'s inputs stand for the enclosing graph's tensors)."""
    values = [*graph.initializers.values(), *(v for node in graph.all_nodes() for v in node.outputs)]
    values += [v for g in graph.subgraphs() for v in (*g.initializers.values(), *g.inputs)]
    return [v for v in values if id(v) not in skip and v.name]


def _renamed(obj, names: dict[str, str]):
    """``obj`` (JSON: the contract) with every string (and dict key) in ``names`` replaced."""
    if isinstance(obj, str):
        return names.get(obj, obj)
    if isinstance(obj, dict):
        return {_renamed(k, names): _renamed(v, names) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_renamed(v, names) for v in obj]
    return obj


def _enclosing_weight(extracted: Extracted, value: ir.Value) -> bool:
    source, tensor = extracted.constants.get(id(value), (None, None))
    return source is not None and value.const_value is tensor


def join_branches(model: ir.Model, branches: list[TrainedBranch], contract: dict) -> None:
    """After the enclosing graph's encoding: the branches read its step and range-update inputs, each If
    returns its branches' updated state (the branch that did not run returns the state it read), the
    enclosing weights the branches train are graph inputs, and ``contract`` (the enclosing graph's, also
    written to the model's metadata) holds theirs."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    for branch in branches:
        branch.step.replace_all_uses_with(inputs[contract["step_input"]])
        if branch.range_update is not None:
            branch.range_update.replace_all_uses_with(inputs[contract["range_update_input"]])
        _merge(contract, branch)
    for node in {id(b.node): b.node for b in branches}.values():
        _return_state(graph, node, [b for b in branches if b.node is node])
    for name in sorted({p for b in branches for p in b.contract.get("parameters", [])}):
        value = graph.initializers.get(name)
        if value is not None and not value.is_graph_input():
            value.type, value.shape = ir.TensorType(value.const_value.dtype), ir.Shape(value.const_value.shape)
            graph.inputs.append(value)
    contract["parameters"] = sorted(set(contract["parameters"]) | {p for b in branches for p in b.contract["parameters"]})
    model.metadata_props[tg.METADATA_KEY] = tg.metadata_json(contract)


def _merge(contract: dict, branch: TrainedBranch) -> None:
    """The branch's state and quantizers join ``contract``; ``branches`` records its part."""
    theirs = branch.contract
    contract["state"].update(theirs["state"])
    part = {key: theirs.get(key, []) for key in tg.BRANCH_KEYS}
    for key, entries in part.items():
        contract.setdefault(key, []).extend(entries)
    contract.setdefault("branches", []).append({"if": branch.node.name, "branch": branch.attribute,
                                                "outputs": len(branch.node.outputs), "state": theirs["state"],
                                                "parameters": theirs["parameters"], **part,
                                                "branches": theirs.get("branches", [])})  # its own, nested


def _return_state(graph: ir.Graph, node: ir.Node, branches: list[TrainedBranch]) -> None:
    """``node`` replaced by an If with one more output per state its branches update."""
    updates = [(b.attribute, state, value) for b in branches for state, value in b.updates]
    count = len(node.outputs)
    for attr in BRANCHES:
        body = node.attributes[attr].as_graph()
        outputs = list(body.outputs)[:count]
        for owner, state, value in updates:
            if owner != attr:  # the other branch's state passes through this one unchanged
                source = graph.initializers[state]
                keep = ir.node("Identity", [source], name=f"{state}/{attr}/keep")
                value = keep.outputs[0]
                value.name, value.dtype = f"{state}{UPDATE_SUFFIX}/{attr}", source.const_value.dtype
                value.shape = ir.Shape(source.const_value.shape)
                body.append(keep)
            outputs.append(value)
        body.outputs.clear()
        body.outputs.extend(outputs)
    new = replace_if(graph, node, count + len(updates))
    for (_, state, _), out in zip(updates, new.outputs[count:]):
        out.name = f"{state}{UPDATE_SUFFIX}"
        tensor = graph.initializers[state].const_value
        out.dtype, out.shape = tensor.dtype, ir.Shape(tensor.shape)
        graph.outputs.append(out)

