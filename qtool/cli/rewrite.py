"""``qtool rewrite-train`` and ``qtool rewrite-eval``."""

from __future__ import annotations

import sys

import click

from qtool import api
from qtool.cli._common import (
    ProgressBars,
    batch_size_option,
    calibration_config,
    calibration_data_option,
    calibration_options,
    in_place_option,
    json_option,
    output_option,
    print_result,
    quant_config,
    quantization_options,
)
from qtool.config import TrainSchedule


def _need_output(params: dict) -> None:
    if params["output"] is None and not params["in_place"]:
        raise click.UsageError("give an output path with -o/--output, or --in-place")


@click.command("rewrite-train")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@quantization_options
@click.option("--quant-delay", type=click.IntRange(0), default=0, show_default=True,
              help="Steps before quantization switches on.")
@click.option("--freeze-bn-delay", type=click.IntRange(0), default=None,
              help="Step after which batch norms use moving statistics.")
@calibration_data_option
@batch_size_option
@calibration_options
@in_place_option
@json_option
def rewrite_train_cmd(model, **params):
    """Write a quantization-aware training graph (tf.contrib.quantize create_training_graph).

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx --quant-delay 2000 --freeze-bn-delay 4000

    The training contract (qtool_step input, state and its ':updated' outputs) is
    in the model's metadata 'qtool.training'; see docs/training.md. After
    training, 'qtool rewrite-eval' makes the int8 model from the trained state.
    """
    _need_output(params)
    bar = ProgressBars(enabled=not params["as_json"] and sys.stderr.isatty())
    try:
        result = api.rewrite_train(
            model, params["output"], quant=quant_config(params), calibration=calibration_config(params),
            schedule=TrainSchedule(params["quant_delay"], params["freeze_bn_delay"]),
            calibration_data=params["calibration_data"], in_place=params["in_place"], progress=bar.calibration,
        )
    finally:
        bar.close()
    print_result(result, params["as_json"])


@click.command("rewrite-eval")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@calibration_data_option
@batch_size_option
@quantization_options
@calibration_options
@click.option("--ranges", "ranges_file", type=click.Path(dir_okay=False), default=None,
              help="Activation ranges from 'qtool calibrate' (or an onnxruntime calibration cache) "
              "instead of --calibration-data.")
@in_place_option
@json_option
def rewrite_eval_cmd(model, **params):
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear and write a deployable int8 model.

    \b
      qtool rewrite-eval model.onnx -o model.qdq.onnx --calibration-data calib.npz
    """
    _need_output(params)
    bar = ProgressBars(enabled=not params["as_json"] and sys.stderr.isatty())
    try:
        result = api.rewrite_eval(
            model, params["output"], quant=quant_config(params), calibration=calibration_config(params),
            calibration_data=params["calibration_data"], ranges=params["ranges_file"],
            in_place=params["in_place"], progress=bar.calibration,
        )
    finally:
        bar.close()
    print_result(result, params["as_json"])
