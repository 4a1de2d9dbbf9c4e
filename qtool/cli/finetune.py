"""``qtool finetune``: quantization-aware training of a ``rewrite-train`` graph (JAX)."""

from __future__ import annotations

import json
import sys

import click

from qtool import api
from qtool.model.io import check_side_output, model_files
from qtool.cli._common import DATA_PATH, json_option, output_option
from qtool.cli._output import write_json
from qtool.finetune.config import AUTO, LEARNING_RATE_CANDIDATES, FinetuneConfig


class _RateOrAuto(click.ParamType):
    """A positive number, or 'auto'."""

    name = "LR|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == AUTO:
            return AUTO
        return click.FloatRange(0, min_open=True).convert(value, param, ctx)


@click.command("finetune")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--data", required=True, type=DATA_PATH,
              help=".npz with one array per model input (samples first), or a folder of them; --labels names another "
                   "array in it (in each file of a folder).")
@output_option
@click.option("--steps", type=click.IntRange(1), default=300, show_default=True,
              help="Length of the schedule (with --resume: the step to reach).")
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True,
              help="Samples per step (1: validation runs one sample at a time too).")
@click.option("--learning-rate", type=_RateOrAuto(), default=1e-4, show_default=True,
              help="Adam's peak learning rate, or 'auto': first a short run of the schedule from the start at each of "
              f"{', '.join(f'{r:g}' for r in LEARNING_RATE_CANDIDATES)}, then the schedule at the rate that "
              "validated best (none if every rate made the model worse than it started).")
@click.option("--probe-steps", type=click.IntRange(0), default=0, show_default=True,
              help="With --learning-rate auto: steps of each probe (0: a quarter of the steps to run, 5 to 25).")
@click.option("--schedule", type=click.Choice(("cosine", "constant")), default="cosine", show_default=True,
              help="Learning-rate schedule over --steps.")
@click.option("--warmup-steps", type=click.IntRange(0), default=0, show_default=True,
              help="Linear warm-up steps before the schedule.")
@click.option("--labels", default=None, metavar="KEY",
              help="Array of --data with integer class ids: cross-entropy is added to the distillation loss.")
@click.option("--distillation", type=click.Choice(("mse", "kl")), default="mse", show_default=True,
              help="Distillation from the float model (the same graph, quantization off): normalized MSE on "
              "every output, or KL divergence on the first output's softmax (logits).")
@click.option("--distillation-weight", type=click.FloatRange(0), default=1.0, show_default=True,
              help="With --labels: weight of the distillation term (0: labels only).")
@click.option("--temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="Temperature of the KL distillation.")
@click.option("--train-ranges/--ema-ranges", default=True, show_default=True,
              help="Train the activation ranges with the optimizer (on top of their moving average), "
              "or let them follow the moving average only.")
@click.option("--keep-best/--keep-last", default=True, show_default=True,
              help="Write the values of the best validation (never worse than the input), or of the last step.")
@click.option("--validation-data", type=DATA_PATH, default=None,
              help=".npz or folder to validate on during training (default: the training data).")
@click.option("--validation-labels", default=None, metavar="KEY",
              help="Array of --validation-data with class ids: the metric is accuracy (default: --labels; "
              "without labels: SQNR of the quantized outputs against the float model's).")
@click.option("--validate-every", type=click.IntRange(0), default=0, show_default=True,
              help="Steps between validations (0: ten per run).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Seed of the batch order.")
@click.option("--resume", is_flag=True,
              help="MODEL is a file written by qtool finetune: continue its schedule from the step it reached.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@json_option
def finetune_cmd(model, data, output, quiet, json_out, **options):
    """Train a 'rewrite-train' graph so the quantized model recovers its accuracy (JAX).

    \b
      qtool rewrite-train model.onnx -o model.qat.onnx --data calib.npz --freeze-bn-delay 0
      qtool finetune model.qat.onnx --data train.npz -o model.tuned.onnx --steps 300
      qtool rewrite-eval model.tuned.onnx -o model.qdq.onnx

    Weights, biases, batch-norm scale/shift and activation ranges are trained
    with TensorFlow's straight-through gradients; the output is a training
    graph with the same contract. See docs/finetune.md.
    """
    if output is None:
        raise click.UsageError("give an output path with -o/--output")
    config = FinetuneConfig(**options)  # every other option is a FinetuneConfig field of the same name
    show = not quiet and json_out != "-"

    def progress(p):
        if show:
            click.echo(f"qtool finetune: {p.format_text()}", err=True)

    check_side_output(json_out, [output], model_files(model) + [data, config.validation_data])
    result = api.finetune(model, data, output, config, progress=progress)
    if json_out == "-":
        click.echo(json.dumps(result.to_dict(), indent=2, default=_json_default))
        return
    if json_out is not None:
        write_json(json_out, result.to_dict())
    click.echo(result.format_text())
    sys.stdout.flush()


def _json_default(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)
