"""Run a model on calibration data in onnxruntime and reduce activations as they come.

The tensors to calibrate become extra graph outputs of a copy of the model;
each batch runs once, every requested tensor goes to its observer and the
batch's outputs are dropped before the next batch runs. Peak memory is one
batch's activations plus the session, whatever the number of samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from qtool.calibrate.data import CalibrationData
from qtool.calibrate.observers import Observer, make_observer
from qtool.errors import QtoolError

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
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "samples": self.num_samples,
            "batches": self.num_batches,
            "seconds": round(self.seconds, 3),
            "tensors": len(self.ranges),
            "ignored_arrays": self.ignored_arrays,
            **({"options": self.options} if self.options else {}),
        }


def _value_map(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    for node in graph:
        for out in node.outputs:
            if out.name:
                values[out.name] = out
    return values


_NUMPY_TYPES = {
    ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8, ir.DataType.UINT8,
    ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64,
    ir.DataType.UINT64, ir.DataType.BOOL,
}


# (enable_mem_pattern, enable_cpu_mem_arena). Measured on a ResNet-50-shaped model (70 tapped
# tensors, batches of 16, onnxruntime 1.32, peak RSS at 16 -> 64 samples; docs/calibration.md, Memory):
# - memory pattern off: the pattern planned from the first run is one extra block allocated on
#   top of the tapped outputs from the second run on (+0.9 GB at every batch after the first);
#   with the arena it grows further (1.90 -> 3.56 GB);
# - CPU arena on: without it each batch's buffers are malloc'ed and freed, and glibc keeps about
#   0.65 GB of them (its mmap threshold rises after the first frees), so the second batch peaks
#   at 1.67 -> 2.32 GB; the arena reuses the first batch's blocks: 1.87 -> 1.88 GB, and 1.93 GB
#   at 256 samples. A shorter last batch fits in the same blocks (+0.07 GB at 72 samples).
#   Also faster: 3.5 s instead of 5.2 s per 32 samples, single-threaded.
SESSION_MEMORY_SETTINGS = (False, True)


def _session(model: ir.Model, output_values: list[ir.Value]):
    """An onnxruntime session computing ``output_values`` as extra outputs.

    The weights are not serialized: the proto carries placeholders and
    onnxruntime gets the tensors as OrtValues over the arrays qtool already
    holds (memory-mapped for external data), so no copy and no 2 GB limit.
    """
    import onnxruntime as ort

    from qtool.onnx_rewrite._io import light_proto

    graph = model.graph
    added = [v for v in output_values if not v.is_graph_output()]
    typed = []
    for v in added:
        if v.type is None:
            v.type = ir.TensorType(ir.DataType.FLOAT)
            typed.append(v)
    graph.outputs.extend(added)
    try:
        proto, saved = light_proto(model, movable=lambda t: t.dtype in _NUMPY_TYPES)
    finally:
        for _ in added:
            graph.outputs.pop()
        for v in typed:
            v.type = None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern, options.enable_cpu_mem_arena = SESSION_MEMORY_SETTINGS
    names = list(saved)
    arrays = [_array(saved[name]) for name in names]
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    if names:
        options.add_external_initializers(names, values)
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise QtoolError(f"onnxruntime cannot run the model for calibration: {str(exc).strip().splitlines()[0]}") from exc
    return session, (arrays, values)  # the arrays must outlive the session


def _contiguous(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def _array(tensor) -> np.ndarray:
    return _contiguous(tensor.numpy())


def _run_batch(session, names: list[str], feed: dict, observers: dict, number: int) -> None:
    """Run one batch and hand each output to its observer.

    A function of its own so that no OrtValue outlives it: each OrtValue of
    ``run_with_ort_values`` keeps the whole output vector alive, so one left
    in a loop variable kept all of a batch's tapped outputs (1.1 GB at batch
    16 on ResNet-50) during the next batch's run, and peak memory doubled.
    """
    import onnxruntime as ort

    # OrtValues in and out: onnxruntime's outputs are read in place, not copied
    inputs = {k: ort.OrtValue.ortvalue_from_numpy(_contiguous(v)) for k, v in feed.items()}
    try:
        outputs = session.run_with_ort_values(names, inputs)
    except Exception as exc:  # noqa: BLE001
        raise QtoolError(
            f"onnxruntime failed on calibration batch {number}: {str(exc).strip().splitlines()[0]}"
        ) from exc
    for name, value in zip(names, outputs):
        observers[name].update(value.numpy())


def collect_ranges(
    model: ir.Model,
    tensors: Sequence[str],
    data: CalibrationData,
    *,
    batch_size: int = 16,
    method: str = "minmax",
    progress: Progress | None = None,
    options: dict | None = None,
) -> CalibrationResult:
    """Observe ``tensors`` of ``model`` over ``data``; returns their ranges.

    Tensors that are graph inputs are observed on the fed batches directly.
    ``options``: the method's options (``percentile``, ``num_bins``,
    ``ema_decay``, ``num_bits``, ``symmetric``; each observer takes the ones it
    uses), checked before anything runs.
    """
    if batch_size < 1:
        raise QtoolError(f"batch size must be at least 1, got {batch_size}")
    start = time.perf_counter()
    values = _value_map(model.graph)
    options = dict(options or {})
    make_observer(method, **options)  # bad methods and options fail before the session is built
    observers = {name: make_observer(method, **options) for name in tensors}
    unknown = [t for t in tensors if t not in values]
    if unknown:
        raise QtoolError(f"cannot calibrate tensor '{unknown[0]}': not in the model")
    from_inputs = [t for t in tensors if values[t].is_graph_input()]
    from_outputs = [t for t in tensors if not values[t].is_graph_input()]

    total = data.num_samples
    batches = 0
    if from_outputs or from_inputs:
        session, keepalive = _session(model, [values[t] for t in from_outputs]) if from_outputs else (None, None)
        done = 0
        if progress is not None:
            progress(0, total)
        for feed in data.batches(batch_size):
            for name in from_inputs:
                observers[name].update(np.asarray(feed[name]))
            if session is not None:
                _run_batch(session, from_outputs, feed, observers, batches + 1)
            batches += 1
            done += len(next(iter(feed.values())))
            if progress is not None:
                progress(done, total)
        del session, keepalive
    ranges = {name: obs.range() for name, obs in observers.items()}
    return CalibrationResult(
        ranges, observers, method, total, batches, time.perf_counter() - start, list(data.ignored), options
    )
