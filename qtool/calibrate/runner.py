"""Run a model on calibration data in onnxruntime and reduce activations as they come.

The tensors to calibrate become extra graph outputs of a copy of the model;
each batch runs once, every requested tensor goes to its observer and the
batch's outputs are dropped before the next batch runs. Peak memory is one
batch's activations plus the session, whatever the number of samples.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.calibrate.data import CalibrationData
from qtool.calibrate.observers import Observer, make_observer
from qtool.errors import QtoolError

# Above this many tensor bytes the session is built from a file with external data.
_SESSION_FROM_FILE_BYTES = 1_500_000_000

Progress = Callable[[int, int], None]  # (samples done, samples total)


@dataclass
class CalibrationResult:
    ranges: dict[str, tuple[float, float] | None]
    observers: dict[str, Observer]
    method: str
    num_samples: int
    num_batches: int
    seconds: float
    ignored_arrays: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "samples": self.num_samples,
            "batches": self.num_batches,
            "seconds": round(self.seconds, 3),
            "tensors": len(self.ranges),
            "ignored_arrays": self.ignored_arrays,
        }


def _value_map(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    for node in graph:
        for out in node.outputs:
            if out.name:
                values[out.name] = out
    return values


def _session(model: ir.Model, output_values: list[ir.Value]):
    import onnxruntime as ort

    from qtool.onnx_rewrite._io import tensor_bytes

    graph = model.graph
    added = [v for v in output_values if not v.is_graph_output()]
    typed = []
    for v in added:
        if v.type is None:
            v.type = ir.TensorType(ir.DataType.FLOAT)
            typed.append(v)
    graph.outputs.extend(added)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        if tensor_bytes(model) > _SESSION_FROM_FILE_BYTES:
            with tempfile.TemporaryDirectory(prefix="qtool-calib-") as tmp:
                path = os.path.join(tmp, "model.onnx")
                ir.save(model, path, external_data="model.onnx.data")
                return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        data = ir.serde.serialize_model(model).SerializeToString()
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise QtoolError(f"onnxruntime cannot run the model for calibration: {str(exc).strip().splitlines()[0]}") from exc
    finally:
        for _ in added:
            graph.outputs.pop()
        for v in typed:
            v.type = None


def collect_ranges(
    model: ir.Model,
    tensors: Sequence[str],
    data: CalibrationData,
    *,
    batch_size: int = 16,
    method: str = "minmax",
    progress: Progress | None = None,
) -> CalibrationResult:
    """Observe ``tensors`` of ``model`` over ``data``; returns their ranges.

    Tensors that are graph inputs are observed on the fed batches directly.
    """
    if batch_size < 1:
        raise QtoolError(f"batch size must be at least 1, got {batch_size}")
    start = time.perf_counter()
    values = _value_map(model.graph)
    observers = {name: make_observer(method) for name in tensors}
    unknown = [t for t in tensors if t not in values]
    if unknown:
        raise QtoolError(f"cannot calibrate tensor '{unknown[0]}': not in the model")
    from_inputs = [t for t in tensors if values[t].is_graph_input()]
    from_outputs = [t for t in tensors if not values[t].is_graph_input()]
    total = data.num_samples
    batches = 0
    if from_outputs or from_inputs:
        session = _session(model, [values[t] for t in from_outputs]) if from_outputs else None
        done = 0
        if progress is not None:
            progress(0, total)
        for feed in data.batches(batch_size):
            for name in from_inputs:
                observers[name].update(np.asarray(feed[name]))
            if session is not None:
                try:
                    outputs = session.run(from_outputs, {k: v if v.flags.c_contiguous else np.ascontiguousarray(v).reshape(v.shape) for k, v in feed.items()})
                except Exception as exc:  # noqa: BLE001
                    raise QtoolError(
                        f"onnxruntime failed on calibration batch {batches + 1}: {str(exc).strip().splitlines()[0]}"
                    ) from exc
                for name, array in zip(from_outputs, outputs):
                    observers[name].update(array)
                del outputs
            batches += 1
            done += len(next(iter(feed.values())))
            if progress is not None:
                progress(done, total)
        del session
    ranges = {name: obs.range() for name, obs in observers.items()}
    return CalibrationResult(
        ranges, observers, method, total, batches, time.perf_counter() - start, list(data.ignored)
    )
