"""``qtool rewrite-train`` and ``qtool rewrite-eval``."""

from __future__ import annotations

import click

from qtool import api
from qtool.model.io import check_side_output, model_files
from qtool.cli._common import (
    DATA_PATH,
    apply_aliases,
    batch_size_option,
    calibration_config,
    calibration_options,
    check_method_options,
    data_option,
    deprecated_alias,
    given,
    in_place_option,
    int8_activations_option,
    json_option,
    latency_option,
    output_option,
    pack_int4_option,
    quant_config,
    quantization_options,
    round_mode_option,
    standard_ops_option,
    verbose_option,
)
from qtool.cli._output import print_result
from qtool.cli._progress import Calibrating, StageProgress
from qtool.config import TrainSchedule


def _prepare(ctx: click.Context, params: dict) -> None:
    apply_aliases(ctx, params)
    if params["output"] is None and not params["in_place"]:
        raise click.UsageError("give an output path with -o/--output, or --in-place")
    check_method_options(ctx, params["calibration_method"])
    if params["data"] is None and any(given(ctx, n) for n in ("calibration_method", "percentile", "num_bins",
                                                                "ema_decay")):
        raise click.UsageError("the calibration options need calibration data (--data)")


def _run(command: str, call):
    progress = StageProgress(command)
    try:
        result = call(Calibrating(progress))
    except BaseException:
        progress.close()
        raise
    progress.finish()
    return result


@click.command("rewrite-train")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@quantization_options
@round_mode_option
@click.option("--quant-delay", type=click.IntRange(0), default=0, show_default=True,
              help="Steps before quantization switches on.")
@click.option("--freeze-bn-delay", type=click.IntRange(0), default=None,
              help="Step after which batch norms use moving statistics.")
@data_option
@deprecated_alias("--calibration-data", "--data", "data", type=DATA_PATH)
@batch_size_option
@calibration_options
@in_place_option
@json_option
@verbose_option
@click.pass_context
def rewrite_train_cmd(ctx, model, **params):
    """Write a quantization-aware training graph (tf.contrib.quantize create_training_graph).

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx --data calib.npz --quant-delay 2000 --freeze-bn-delay 4000

    --data gives the activation ranges a start (else TensorFlow's defaults). The
    training contract (qtool_step input, state and its ':updated' outputs) is
    in the model's metadata 'qtool.training'; see docs/training.md. Train it
    with 'qtool finetune'; then 'qtool rewrite-eval' makes the int8 model.
    """
    _prepare(ctx, params)
    check_side_output(params["json_out"], [params["output"]], model_files(model) + [params["data"]])
    quant, calibration = quant_config(params), calibration_config(params)
    schedule = TrainSchedule(params["quant_delay"], params["freeze_bn_delay"])
    result = _run("rewrite-train", lambda progress: api.rewrite_train(
        model, params["output"], quant=quant, calibration=calibration, schedule=schedule,
        calibration_data=params["data"], in_place=params["in_place"], progress=progress))
    print_result(result, params["json_out"], params["verbose"])


@click.command("rewrite-eval")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@data_option
@deprecated_alias("--calibration-data", "--data", "data", type=DATA_PATH)
@batch_size_option
@quantization_options
@standard_ops_option
@pack_int4_option
@int8_activations_option
@round_mode_option
@calibration_options(auto=True)
@click.option("--ranges", "ranges_file", type=click.Path(dir_okay=False), default=None,
              help="Activation ranges from 'qtool calibrate' (or an onnxruntime calibration cache) instead of --data.")
@latency_option
@in_place_option
@json_option
@verbose_option
@click.pass_context
def rewrite_eval_cmd(ctx, model, **params):
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear and write a deployable int8 model.

    \b
      qtool rewrite-eval model.onnx -o model.qdq.onnx --data calib.npz
    """
    _prepare(ctx, params)
    check_side_output(params["json_out"], [params["output"]],
                      model_files(model) + [params["data"], params["ranges_file"]])
    quant, calibration = quant_config(params), calibration_config(params)
    result = _run("rewrite-eval", lambda progress: api.rewrite_eval(
        model, params["output"], quant=quant, calibration=calibration, calibration_data=params["data"],
        ranges=params["ranges_file"], in_place=params["in_place"], progress=progress,
        latency_rounds=params["latency_rounds"]))
    print_result(result, params["json_out"], params["verbose"])
