"""``qtool rewrite-train`` and ``qtool rewrite-eval``."""

from __future__ import annotations

import json
import sys

import click

from qtool.cli._common import (
    ProgressBars,
    activation_bits_option,
    batch_size_option,
    calibration_data_option,
    calibration_options,
    in_place_option,
    json_option,
    method_options,
    output_option,
    per_channel_option,
    scope_option,
    symmetric_option,
    weight_bits_option,
)


@click.command("rewrite-train")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@weight_bits_option
@activation_bits_option
@symmetric_option
@click.option("--quant-delay", type=click.IntRange(0), default=0, show_default=True,
              help="Steps before quantization switches on.")
@click.option("--freeze-bn-delay", type=click.IntRange(0), default=None,
              help="Step after which batch norms use moving statistics.")
@scope_option
@per_channel_option
@calibration_data_option
@batch_size_option
@calibration_options
@in_place_option
@json_option
def rewrite_train_cmd(model, output, weight_bits, activation_bits, symmetric, quant_delay, freeze_bn_delay, scope,
                      per_channel, calibration_data, batch_size, calibration_method, percentile, num_bins, ema_decay,
                      in_place, as_json):
    """Write a quantization-aware training graph (tf.contrib.quantize create_training_graph).

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx --quant-delay 2000 --freeze-bn-delay 4000

    The training contract (qtool_step input, state and its ':updated' outputs) is
    in the model's metadata 'qtool.training'; see docs/training.md. After
    training, 'qtool rewrite-eval' makes the int8 model from the trained state.
    """
    from qtool.onnx_rewrite.train_rewrite import rewrite_train

    if output is None and not in_place:
        raise click.UsageError("give an output path with -o/--output, or --in-place")
    bar = ProgressBars(enabled=not as_json and sys.stderr.isatty())
    try:
        result = rewrite_train(
            model,
            output,
            weight_bits=weight_bits,
            activation_bits=activation_bits,
            symmetric=symmetric,
            quant_delay=quant_delay,
            freeze_bn_delay=freeze_bn_delay,
            scope=scope,
            per_channel=per_channel,
            calibration_data=calibration_data,
            batch_size=batch_size,
            calibration_method=calibration_method,
            calibration_options=method_options(calibration_method, percentile, num_bins, ema_decay),
            in_place=in_place,
            progress=bar.calibration,
        )
    finally:
        bar.close()
    for warning in result.warnings:
        click.echo(f"qtool: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(result.format_text())


@click.command("rewrite-eval")
@click.argument("model", type=click.Path(dir_okay=False))
@output_option
@calibration_data_option
@batch_size_option
@weight_bits_option
@activation_bits_option
@symmetric_option
@per_channel_option
@scope_option
@click.option("--exclude", multiple=True, metavar="NODE_NAME", help="Keep this node in float (repeatable).")
@calibration_options
@click.option("--ranges", "ranges_file", type=click.Path(dir_okay=False), default=None,
              help="Activation ranges from 'qtool calibrate' (or an onnxruntime calibration cache) "
              "instead of --calibration-data.")
@in_place_option
@json_option
def rewrite_eval_cmd(model, output, calibration_data, batch_size, weight_bits, activation_bits, symmetric,
                     per_channel, scope, exclude, calibration_method, percentile, num_bins, ema_decay, ranges_file,
                     in_place, as_json):
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear and write a deployable int8 model.

    \b
      qtool rewrite-eval model.onnx -o model.qdq.onnx --calibration-data calib.npz
    """
    from qtool.onnx_rewrite.eval_rewrite import rewrite_eval

    if output is None and not in_place:
        raise click.UsageError("give an output path with -o/--output, or --in-place")
    bar = ProgressBars(enabled=not as_json and sys.stderr.isatty())
    try:
        result = rewrite_eval(
            model,
            output,
            calibration_data=calibration_data,
            batch_size=batch_size,
            weight_bits=weight_bits,
            activation_bits=activation_bits,
            symmetric=symmetric,
            per_channel=per_channel,
            scope=scope,
            exclude=exclude,
            in_place=in_place,
            progress=bar.calibration,
            calibration_method=calibration_method,
            calibration_options=method_options(calibration_method, percentile, num_bins, ema_decay),
            ranges=ranges_file,
        )
    finally:
        bar.close()
    for warning in result.warnings:
        click.echo(f"qtool: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(result.format_text())
