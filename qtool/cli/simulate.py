"""``qtool simulate``: what quantization costs, and where."""

from __future__ import annotations

import json

import click

from qtool import api
from qtool.errors import QtoolError
from qtool.simulate.config import SimulateConfig
from qtool.simulate.report import json_safe

from qtool.cli._common import DATA_PATH, batch_size_option, calibration_data_option, json_option, latency_option, scope_option
from qtool.cli._progress import StageProgress


@click.command("simulate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", type=DATA_PATH, required=True,
              help=".npz with one array per model input (samples first), and optionally the labels; or a folder of "
                   "them (read lazily).")
@click.option("--labels", default=None, metavar="NAME", help="Array in --data holding integer class ids.")
@click.option("--output", "output_name", default=None, metavar="NAME", help="Model output to compare (default: the first float one).")
@click.option("--batch-axis", multiple=True, metavar="[OUTPUT=]AXIS",
              help="Samples axis of the outputs when it is not 0 (e.g. 1 for a time-major RNN's state; none for "
                   "an output of one sample without one, from a model exported for batch 1); "
                   "AXIS for all outputs or OUTPUT=AXIS for one (repeatable).  [default: 0]")
@click.option("--class-axis", type=int, default=None, metavar="AXIS",
              help="Axis of the compared output that holds the classes, for a top-1 per position (frame, pixel, "
                   "token): a tagger's [N, T, C] output takes -1, a segmenter's [N, C, H, W] 1. --labels then hold "
                   "one class id per position.  [default: one top-1 per sample]")
@latency_option
@click.option("--quantized", multiple=True, type=click.Path(dir_okay=False),
              help="Quantized model to compare (repeatable). Without it: a what-if table quantized in memory.")
@click.option("--weight-bits", default=None, metavar="LIST",
              help="Comma-separated weight bit widths for the what-if table.  [default: 8]")
@click.option("--activation-bits", default=None, metavar="LIST",
              help="Comma-separated activation bit widths for the what-if table.  [default: 8]")
@calibration_data_option
@click.option("--sensitivity", is_flag=True, help="Also quantize one layer at a time and rank layers by damage.")
@json_option
@scope_option
@click.option("--exclude", multiple=True, metavar="NODE_NAME", help="Keep this node in float in the what-if table "
              "(repeatable).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Write a self-contained HTML report: summary, advice, plots.")
@click.option("-v", "--verbose", is_flag=True, help="Every row of every table, and the notes.")
@batch_size_option
def simulate_cmd(model, data, json_out, html_path, verbose, **params):
    """Report accuracy and per-tensor error of quantized versions of MODEL.

    \b
      qtool simulate model.onnx --data eval.npz --labels labels --quantized model.qdq.onnx
      qtool simulate model.onnx --data eval.npz --labels labels --weight-bits 4,8 \\
          --activation-bits 8,16 --calibration-data calib.npz --html report.html
    """
    quantized, weight_bits, activation_bits = params["quantized"], params["weight_bits"], params["activation_bits"]
    if quantized and (weight_bits is not None or activation_bits is not None or params["scope"] or params["exclude"]):
        raise QtoolError("--weight-bits/--activation-bits/--scope/--exclude build the what-if table; they do not "
                         "apply with --quantized")
    config = SimulateConfig(
        labels=params["labels"], output=params["output_name"], quantized=quantized,
        weight_bits=weight_bits if weight_bits is not None else "8",
        activation_bits=activation_bits if activation_bits is not None else "8",
        calibration_data=params["calibration_data"], sensitivity=params["sensitivity"],
        batch_size=params["batch_size"], histograms=html_path is not None,
        batch_axis=list(params["batch_axis"]) or None, scope=params["scope"], exclude=params["exclude"],
        class_axis=params["class_axis"], latency_rounds=params["latency_rounds"] or 0,
    )
    json_path = json_out if json_out not in (None, "-") else None
    api.check_simulate_outputs(model, data, config, json_path, html_path)  # before any work
    progress = StageProgress("simulate")
    try:
        result = api.simulate(model, data, config, progress=progress.update)
        if json_path:
            progress.update("writing JSON", 0, 0)
            result.write_json(json_path)
        if html_path:
            progress.update("writing HTML", 0, 0)
            result.write_html(html_path)
    except BaseException:
        progress.close()
        raise
    progress.finish()
    if json_out == "-":
        click.echo(json.dumps(json_safe(result.to_dict()), indent=2, allow_nan=False))
        return
    click.echo(result.format_text(verbose=verbose))
    for path, what in ((json_path, "JSON"), (html_path, "HTML")):
        if path:
            click.echo(f"{what} report: {path}")
