"""What a simulation reads: the models (through the one model loader) and the data with its labels."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from qtool.data import CalibrationData, input_specs, load_calibration_data
from qtool.errors import QtoolError
from qtool.model.io import load_model


@dataclass
class ModelInput:
    """A model to run: its IR (ours to edit: a fresh load or a copy), its file if any, and a label."""

    model: ir.Model
    path: str | None
    label: str


def load(model, what: str) -> ModelInput:
    """A path (read lazily: external data stays on disk), an ``onnx.ModelProto`` or an ``onnx_ir.Model``.

    A model given in memory is copied (the copy shares the tensors), so the caller's is never edited.
    """
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        return ModelInput(load_model(path).model, path, path)
    if isinstance(model, onnx.ModelProto):
        return ModelInput(ir.serde.deserialize_model(model), None, f"<{what}>")
    if isinstance(model, ir.Model):
        return ModelInput(model.clone(), None, f"<{what}>")
    raise QtoolError(f"{what} must be a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


_FLOATING = (None, ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)


def output_name(model: ModelInput, output: str | None) -> str:
    """The compared output: ``output``, checked, or the model's first float one (a sentence-transformers export
    returns its int64 input_ids first: compared, int8 read as 100 % agreement and infinite SQNR)."""
    names = [v.name for v in model.model.graph.outputs]
    if not names:
        raise QtoolError(f"the model '{model.label}' has no outputs")
    if output is None:
        return next((v.name for v in model.model.graph.outputs if v.dtype in _FLOATING), names[0])
    if output not in names:
        raise QtoolError(f"the model '{model.label}' has no output {output!r} (outputs: {', '.join(names)})")
    return output


# Ops that keep a row's order (non-strictly) and its values' place: a sorted row read through them stays sorted.
_ORDER_KEEPING = frozenset({"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Relu", "Sigmoid",
                            "Exp", "Clip"})


def sorting_node(model: ModelInput, output: str) -> str | None:
    """The TopK (sorted) whose values ``output`` is, read through ops that keep order: its top-1 is always the first
    place. A hint only: ``run_simulation`` checks on the float output that every row is sorted."""
    value = next((v for v in model.model.graph.outputs if v.name == output), None)
    while value is not None and (node := value.producer()) is not None:
        if node.op_type == "TopK" and node.domain in ("", "ai.onnx") and value.index() == 0:
            sort = node.attributes.get("sorted")
            return None if sort is not None and not sort.as_int() else f"TopK {node.name!r}"
        if node.op_type not in _ORDER_KEEPING or node.domain not in ("", "ai.onnx") or not node.inputs:
            return None
        value = node.inputs[0]
    return None


def _read_arrays(data) -> dict[str, np.ndarray]:
    """Arrays given in memory (a path is read lazily: :func:`_read_file`)."""
    if isinstance(data, np.ndarray):
        return {"": data}
    if isinstance(data, dict):
        return {str(k): np.asarray(v) for k, v in data.items()}
    raise QtoolError(f"data must be an .npz path, a folder or a dict of arrays, got {type(data).__name__}")


def _labels(arrays: dict, labels: str, where: str, per_position: bool) -> np.ndarray:
    if labels not in arrays:
        have = ", ".join(repr(k) for k in arrays if k) or "none"
        raise QtoolError(f"no labels array {labels!r} in {where} (arrays: {have})")
    label_array = np.asarray(arrays.pop(labels))
    if per_position:  # one class id per position (frame, pixel, token): checked against the output per batch
        if label_array.ndim < 1:
            raise QtoolError(f"labels {labels!r} must have the samples on their first axis, got a scalar")
    else:
        if label_array.ndim == 2 and label_array.shape[1] == 1:
            label_array = label_array[:, 0]
        if label_array.ndim != 1:
            raise QtoolError(f"labels {labels!r} must be one class id per sample (1-D), got shape "
                             f"{list(label_array.shape)} (per-position labels need --class-axis)")
    if label_array.dtype.kind not in "iu":
        raise QtoolError(f"labels {labels!r} must be integer class ids, got dtype {label_array.dtype}")
    return label_array


class JoinedLabels:
    """A folder's labels, file by file in the data's order, sliced as one array (per-position labels of files
    of different shapes cannot be one)."""

    def __init__(self, pieces: list[np.ndarray]):
        self.pieces = pieces
        self.starts = np.cumsum([0] + [len(p) for p in pieces])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(len(self))
        parts = [p[max(start - s, 0): stop - s] for p, s in zip(self.pieces, self.starts[:-1])
                 if s < stop and s + len(p) > start]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _read_path(path: str, model: ir.Model, labels: str | None,
               per_position: bool) -> tuple[CalibrationData, np.ndarray | JoinedLabels | None]:
    """A data file or a folder of them, read lazily (by :mod:`qtool.data`: rows as batches are fed, memory not
    growing with the samples), and each file's labels."""
    loaded = _checked(path, model, f"'{path}'")
    if labels is None:
        return loaded, None
    pieces = []
    for part in (p for group in loaded.shape_groups() for p in group):
        array = part.read_array(labels)
        where = f"'{part.source}'"
        held = {name: None for name in (part.members or {}) if name != labels}  # named in the error
        pieces.append(_labels(held if array is None else {labels: array}, labels, where, per_position))
        if len(pieces[-1]) != part.num_samples:
            raise QtoolError(f"labels {labels!r} hold {len(pieces[-1])} class ids but {where} has "
                             f"{part.num_samples} samples")
    loaded.ignored = [name for name in loaded.ignored if name != labels]
    return loaded, pieces[0] if len(pieces) == 1 else JoinedLabels(pieces)


def _checked(arrays, model: ir.Model, where: str) -> CalibrationData:
    try:
        return load_calibration_data(arrays, input_specs(model))
    except QtoolError as exc:
        message = str(exc).replace("calibration data", "data").replace("calibration arrays", "arrays")
        raise QtoolError(message if where.strip("'") in message else f"{where}: {message}") from None


def read_data(data, model: ir.Model, labels: str | None,
              per_position: bool = False) -> tuple[CalibrationData, np.ndarray | JoinedLabels | None]:
    """The evaluation data checked against the model's inputs, and the labels (or None). A file or a folder
    is read lazily."""
    if isinstance(data, (str, os.PathLike)):
        return _read_path(os.fspath(data), model, labels, per_position)
    arrays = _read_arrays(data)
    label_array = _labels(arrays, labels, "the data", per_position) if labels is not None else None
    loaded = _checked(arrays, model, "the data")
    if label_array is not None and len(label_array) != loaded.num_samples:
        raise QtoolError(
            f"labels {labels!r} hold {len(label_array)} class ids but the data has {loaded.num_samples} samples"
        )
    return loaded, label_array


def check_inputs_match(float_model: ir.Model, q: ModelInput, output: str) -> None:
    """A quantized model must take the float model's inputs and have the compared output."""
    fs = {s.name: s for s in input_specs(float_model)}
    qs = {s.name: s for s in input_specs(q.model)}
    if set(fs) != set(qs):
        raise QtoolError(
            f"quantized model '{q.label}' has inputs {sorted(qs)}, the float model has {sorted(fs)}: they must match"
        )
    for name, f in fs.items():
        s = qs[name]
        if f.dtype is not None and s.dtype is not None and f.dtype != s.dtype:
            raise QtoolError(f"quantized model '{q.label}': input '{name}' is {s.dtype}, in the float model {f.dtype}")
        if f.shape is not None and s.shape is not None and (len(f.shape) != len(s.shape) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(f.shape, s.shape)
        )):
            raise QtoolError(
                f"quantized model '{q.label}': input '{name}' has shape {s.describe_shape()}, "
                f"in the float model {f.describe_shape()}"
            )
    q_outs = [v.name for v in q.model.graph.outputs]
    if output not in q_outs:
        raise QtoolError(f"quantized model '{q.label}' has no output {output!r} (its outputs: {', '.join(q_outs)})")
