"""``qtool calibrate``: activation ranges to a JSON file, for ``rewrite-eval --ranges``."""

from __future__ import annotations

import json
import sys

import click

from qtool import api
from qtool.cli._common import (
    ProgressBars,
    batch_size_option,
    calibration_config,
    calibration_method_option,
    ema_decay_option,
    json_option,
    num_bins_option,
    percentile_option,
    quant_config,
    quantization_options,
)


@click.command("calibrate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False), required=True,
              help=".npz with one array per model input (first axis = samples), or a .npy for a one-input model.")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              help="Ranges file to write (JSON, see docs/calibration.md).")
@calibration_method_option("--method")
@percentile_option
@num_bins_option
@ema_decay_option
@batch_size_option
@quantization_options
@json_option
def calibrate_cmd(model, data, output, as_json, **params):
    """Run MODEL on --data and write the range of every tensor rewrite-eval would quantize.

    Use the same quantization options (bits, --symmetric, --scope, --exclude)
    here and in rewrite-eval: they decide which tensors are quantized.

    \b
      qtool calibrate model.onnx --data calib.npz -o ranges.json --method entropy
      qtool rewrite-eval model.onnx -o model.qdq.onnx --ranges ranges.json
    """
    bar = ProgressBars(enabled=not as_json and sys.stderr.isatty())
    try:
        summary = api.calibrate_to_file(model, data, output, quant=quant_config(params),
                                        calibration=calibration_config(params), progress=bar.calibration).to_dict()
    finally:
        bar.close()
    for warning in summary["warnings"]:
        click.echo(f"qtool: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    options = ", ".join(f"{k}={v}" for k, v in summary["options"].items())
    click.echo(
        f"calibrated {summary['tensors']} tensor(s) of {summary['model']} on {summary['samples']} sample(s) "
        f"in {summary['batches']} batch(es), {summary['method']}{f' ({options})' if options else ''}, "
        f"{summary['seconds']:.2f} s"
    )
    click.echo(f"wrote {summary['output']}")
