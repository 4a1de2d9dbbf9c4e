"""``qtool rewrite-train`` and ``qtool rewrite-eval``."""

from __future__ import annotations

import click

from qtool.cli._common import (
    activation_bits_option,
    batch_size_option,
    calibration_data_option,
    in_place_option,
    json_option,
    not_built,
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
@in_place_option
@json_option
def rewrite_train_cmd(model, output, **options):
    """Write a quantization-aware training graph (tf.contrib.quantize create_training_graph)."""
    not_built("rewrite-train", "issue 5")


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
@in_place_option
@json_option
def rewrite_eval_cmd(model, output, **options):
    """Fold batch norms, insert QuantizeLinear/DequantizeLinear and write a deployable int8 model."""
    not_built("rewrite-eval", "issue 3")
