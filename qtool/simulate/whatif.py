"""The what-if table: the float model quantized in memory for every bit width pair, from one calibration.

Min/max activation ranges do not depend on the bit widths (the quantizer of
each width is computed from the same range), so the data runs through the
model once and every pair's model is written from those ranges (once per
distinct plan, where the bit widths change a rewrite: a ConvTranspose becomes
a Conv at 8-bit weights, not at 4). That work
joins the rewrites and calibration, so ``qtool.api`` hands it in as a
:data:`Quantize` function; this module chooses the data and names the models.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from qtool.data import CalibrationData, input_specs, load_calibration_data
from qtool.simulate.config import SimulateConfig
from qtool.simulate.inputs import ModelInput
from qtool.simulate.result import CalibrationInfo

EVAL_DATA_NOTE = ("calibrated on the evaluation data itself (no --calibration-data was given): "
                  "ranges fit this data exactly, so the accuracy shown is optimistic")


# (float model, calibration data, [(weight bits, activation bits)], the config, progress(done, total))
#   -> ([(quantized model, warnings)] in the order of the pairs, calibration runs)
Quantize = Callable[[ir.Model, CalibrationData, list, SimulateConfig, Callable | None], list]


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
    float_model: ModelInput, dataset: CalibrationData, config: SimulateConfig, quantize: Quantize,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[QuantizedModel], CalibrationInfo, list[str]]:
    """One model per (weight, activation) bit pair; (models, calibration info, notes)."""
    start = time.perf_counter()
    data, label, on_eval = _calibration_data(config, float_model.model, dataset)
    pairs = [(wb, ab) for wb in config.weight_bits for ab in config.activation_bits]
    notes = [EVAL_DATA_NOTE] if on_eval else []
    models = []
    quantized, runs = quantize(float_model.model, data, pairs, config, progress)
    for (wb, ab), (model, warnings) in zip(pairs, quantized):
        name = f"W{wb}A{ab}"
        notes += [f"{name}: {w}" for w in warnings]
        models.append(QuantizedModel(name, ModelInput(model, None, name), wb, ab))
    info = CalibrationInfo(label, on_eval, data.num_samples, round(time.perf_counter() - start, 3), runs)
    return models, info, notes
