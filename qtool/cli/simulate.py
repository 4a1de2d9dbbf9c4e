"""``qtool simulate``: what quantization costs, and where."""

from __future__ import annotations

import click

from qtool.cli._common import batch_size_option, calibration_data_option, not_built


@click.command("simulate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", type=click.Path(dir_okay=False), required=True, help=".npz with the evaluation inputs.")
@click.option("--labels", default=None, metavar="NAME", help="Array in --data holding class ids.")
@click.option("--output", "output_name", default=None, metavar="NAME", help="Model output to compare (default: first).")
@click.option("--quantized", multiple=True, type=click.Path(dir_okay=False), help="Quantized model(s) to compare.")
@click.option("--weight-bits", default="8", show_default=True, help="Comma-separated weight bit widths for the what-if table.")
@click.option("--activation-bits", default="8", show_default=True, help="Comma-separated activation bit widths.")
@calibration_data_option
@click.option("--sensitivity", is_flag=True, help="Quantize one layer at a time and rank layers by damage.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write every number as JSON.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None, help="Write an HTML report.")
@batch_size_option
def simulate_cmd(model, **options):
    """Report accuracy and per-tensor error of quantized versions of MODEL."""
    not_built("simulate", "issue 6")
