"""The what-if table: the float model quantized in memory for every bit width pair, from one calibration.

Min/max activation ranges do not depend on the bit widths (the quantizer of
each width is computed from the same range), so the data runs through the
model once: the tensors every pair's plan quantizes are observed together,
and each pair's model is written by ``rewrite_eval`` from those ranges.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from qtool.calibrate.data import CalibrationData, input_specs, load_calibration_data
from qtool.calibrate.runner import collect_ranges
from qtool.onnx_rewrite.eval_rewrite import prepare_for_calibration, rewrite_eval
from qtool.simulate.config import SimulateConfig
from qtool.simulate.inputs import ModelInput
from qtool.simulate.result import CalibrationInfo

EVAL_DATA_NOTE = ("calibrated on the evaluation data itself (no --calibration-data was given): "
                  "ranges fit this data exactly, so the accuracy shown is optimistic")


@dataclass
class QuantizedModel:
    """A model to compare with the float one."""

    name: str
    model: ModelInput
    weight_bits: int | None = None
    activation_bits: int | None = None

    @property
    def source(self) -> str:
        return "rewrite_eval (in memory)" if self.weight_bits is not None else self.model.label


def _calibration_data(config: SimulateConfig, model: ir.Model, dataset: CalibrationData):
    if config.calibration_data is None:
        return dataset, dataset.source or "<data>", True
    source = config.calibration_data
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<arrays>"
    return load_calibration_data(source, input_specs(model)), label, False


def quantize_in_memory(
    float_model: ModelInput, dataset: CalibrationData, config: SimulateConfig,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[QuantizedModel], CalibrationInfo, list[str]]:
    """One model per (weight, activation) bit pair; (models, calibration info, notes)."""
    start = time.perf_counter()
    data, label, on_eval = _calibration_data(config, float_model.model, dataset)
    pairs = [(wb, ab) for wb in config.weight_bits for ab in config.activation_bits]
    # the plan (which tensors are quantized) does not depend on the bit widths: one fold and plan, one
    # calibration; rewrite_eval checks each pair's plan against these ranges and names a missing one
    folded, tensors = prepare_for_calibration(float_model.model, weight_bits=max(config.weight_bits),
                                              activation_bits=max(config.activation_bits))
    ranges = collect_ranges(folded, tensors, data, batch_size=config.batch_size, method="minmax",
                            progress=progress).ranges if tensors else {}
    notes = [EVAL_DATA_NOTE] if on_eval else []
    models = []
    for wb, ab in pairs:
        name = f"W{wb}A{ab}"
        result = rewrite_eval(float_model.model, ranges=ranges or None, weight_bits=wb, activation_bits=ab)
        notes += [f"{name}: {w}" for w in result.warnings]
        models.append(QuantizedModel(name, ModelInput(result.model, None, name), wb, ab))
    info = CalibrationInfo(label, on_eval, data.num_samples, round(time.perf_counter() - start, 3))
    return models, info, notes
