"""``qtool calibrate``: activation ranges to a JSON file, for ``rewrite-eval --ranges``."""

from __future__ import annotations

import json

import click

from qtool import api
from qtool.model.io import check_side_output, model_files
from qtool.cli._common import (
    DATA_HELP,
    DATA_PATH,
    apply_aliases,
    batch_size_option,
    calibration_config,
    calibration_options,
    check_method_options,
    deprecated_alias,
    json_option,
    quant_config,
    quantization_options,
)
from qtool.cli._output import write_json
from qtool.cli._progress import Calibrating, StageProgress


@click.command("calibrate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=DATA_PATH, required=True, help=DATA_HELP)
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              help="Ranges file to write (JSON, see docs/calibration.md).")
@calibration_options
@deprecated_alias("--method", "--calibration-method", "calibration_method",
                  type=click.Choice(("minmax", "ema", "percentile", "entropy", "mse")))
@batch_size_option
@quantization_options
@json_option
@click.pass_context
def calibrate_cmd(ctx, model, data, output, json_out, **params):
    """Run MODEL on --data and write the range of every tensor rewrite-eval would quantize.

    Use the same quantization options (bits, --symmetric, --scope, --exclude)
    here and in rewrite-eval: they decide which tensors are quantized.

    \b
      qtool calibrate model.onnx --data calib.npz -o ranges.json --calibration-method entropy
      qtool rewrite-eval model.onnx -o model.qdq.onnx --ranges ranges.json
    """
    apply_aliases(ctx, params)
    check_method_options(ctx, params["calibration_method"])
    check_side_output(json_out, [output], model_files(model) + [data])
    progress = StageProgress("calibrate")
    try:
        summary = api.calibrate_to_file(
            model, data, output, quant=quant_config(params), calibration=calibration_config(params),
            progress=Calibrating(progress)).to_dict()
    except BaseException:
        progress.close()
        raise
    progress.finish()
    for warning in summary["warnings"]:
        click.echo(f"qtool: warning: {warning}", err=True)
    if json_out == "-":
        click.echo(json.dumps(summary, indent=2))
        return
    if json_out is not None:
        write_json(json_out, summary)
    options = ", ".join(f"{k}={v}" for k, v in summary["options"].items())
    click.echo(
        f"calibrated {summary['tensors']} tensor(s) of {summary['model']} on {summary['samples']} sample(s) "
        f"in {summary['batches']} batch(es), {summary['method']}{f' ({options})' if options else ''}, "
        f"{summary['seconds']:.2f} s"
    )
    click.echo(f"wrote {summary['output']}")
