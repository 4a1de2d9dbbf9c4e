"""``finetune``: train a qtool training graph (``rewrite-train``'s output) with JAX.

The story (spec/rewrites.md section 7, docs/finetune.md):

1. read the training graph and its contract (``qtool.training`` metadata):
   the step input, the state (``<state>`` -> ``<state>:updated``), the
   trainable ``parameters``, the activation quantizers' min/max state;
2. interpret it as a JAX function (:mod:`qtool.finetune.interpreter`);
   FakeQuant has TF's straight-through gradients;
3. the teacher is the same graph with every FakeQuant switched off and the
   batch norms frozen (the float model), with the parameters it started from;
4. each step: feed the batch, ``qtool_step`` (so ``quant_delay`` and
   ``freeze_bn_delay`` act as the contract says) and the state; loss =
   distillation (normalized MSE on the outputs, or KL on the logits), plus
   cross-entropy with ``labels``; optax Adam with a cosine schedule updates
   the parameters and the activation ranges; every ``:updated`` output
   becomes the next state (an activation range is its EMA update plus the
   optimizer's step); weight ranges are recomputed by the graph from the
   weights;
5. write the trained values into the initializers of a copy of the graph
   (same contract; ``qtool.finetune`` metadata records the step reached, so
   ``resume`` continues the schedule) and save it atomically.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from qtool.data import input_specs, load_calibration_data
from qtool.errors import QtoolError
from qtool.finetune.config import (
    FINETUNE_METADATA_KEY,
    FinetuneConfig,
    FinetuneProgress,
    FinetuneResult,
    _fmt_metric,
)
from qtool.finetune.interpreter import Interpreter
from qtool.model.io import check_output_path, load_model, save_model
from qtool.onnx_rewrite import train_graph as tg

_TEACHER_STEP = 2**30  # past every delay: batch norms frozen (quantization is off for the teacher anyway)
_MIN_RANGE = 1e-6


# --- data ---------------------------------------------------------------------------------------
@dataclass
class _Data:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    num: int
    source: str
    fixed_batch: int | None = None  # the model's static batch size, if it has one


def _load_data(source, specs, labels_key: str | None, what: str, require_labels: bool) -> _Data:

    try:
        data = load_calibration_data(source, specs)
    except QtoolError as exc:
        raise QtoolError(str(exc).replace("calibration data", f"{what} data").replace("calibration arrays",
                                                                                      f"{what} arrays")) from exc
    labels = None
    if labels_key is not None:
        if isinstance(source, (str, os.PathLike)):
            archive = np.load(os.fspath(source), allow_pickle=False)
            if not hasattr(archive, "files"):
                raise QtoolError(f"{what} data '{os.fspath(source)}' is a single array: labels ('{labels_key}') "
                                 "need an .npz holding the inputs and the labels")
            with archive:
                labels = archive[labels_key] if labels_key in archive.files else None
        elif isinstance(source, Mapping):
            labels = np.asarray(source[labels_key]) if labels_key in source else None
        if labels is None and require_labels:
            raise QtoolError(f"{what} data '{data.source or '<arrays>'}' has no array '{labels_key}' (--labels)")
        if labels is not None:
            if labels.shape[:1] != (data.num_samples,):
                raise QtoolError(f"{what} labels '{labels_key}' have {labels.shape[0] if labels.ndim else 0} "
                                 f"entries for {data.num_samples} samples")
            if labels.dtype.kind not in "iu":
                raise QtoolError(f"{what} labels '{labels_key}' must be integer class ids, got {labels.dtype}")
    # training samples batches in random order: the arrays are read whole (calibration streams them)
    arrays = {name: np.asarray(a) for name, a in data.arrays.items()}
    return _Data(arrays, labels, data.num_samples, data.source or "<arrays>", data.fixed_batch)


# --- the contract ---------------------------------------------------------------------------------------
@dataclass
class _Roles:
    step_input: str
    state: dict[str, str]  # state -> updated output
    parameters: list[str]
    ranges: list[tuple[str, str]]  # activation (min, max) state names
    weight_prefixes: list[str]
    data_outputs: list[str]
    quant_delay: int
    freeze_bn_delay: int | None


def _roles(contract: dict, interp: Interpreter) -> _Roles:
    try:
        state = dict(contract["state"])
        parameters = [p for p in contract.get("parameters", [])]
        ranges = [(q["min"], q["max"]) for q in contract.get("activation_quantizers", [])]
        weight_prefixes = [q["quantizer"] for q in contract.get("weight_quantizers", [])]
        step_input = contract["step_input"]
        quant_delay = int(contract.get("quant_delay") or 0)
        freeze = contract.get("freeze_bn_delay")
        freeze = None if freeze is None else int(freeze)
    except (KeyError, TypeError, ValueError) as exc:
        raise QtoolError(f"{interp.label}: the training contract is incomplete ({exc!r})") from exc
    for name in list(state) + parameters:
        if name not in interp.initializers:
            raise QtoolError(f"{interp.label}: the training contract names '{name}', which is not an initializer")
    updated = set(state.values())
    missing = [u for u in updated if u not in interp.output_names]
    if missing:
        raise QtoolError(f"{interp.label}: the training contract's output '{missing[0]}' is not a graph output")
    if step_input not in interp.input_names:
        raise QtoolError(f"{interp.label}: the step input '{step_input}' is not a graph input")
    data_outputs = [o for o in interp.output_names if o not in updated]
    if not data_outputs:
        raise QtoolError(f"{interp.label}: the graph has no output besides its state updates")
    return _Roles(step_input, state, parameters, ranges, weight_prefixes, data_outputs, quant_delay, freeze)


# --- losses and metrics -------------------------------------------------------------------------------
def _distill_loss(kind: str, student: list, teacher: list, temperature: float):
    if kind == "kl":
        t = jax.nn.log_softmax(teacher[0] / temperature, axis=-1)
        s = jax.nn.log_softmax(student[0] / temperature, axis=-1)
        return jnp.mean(jnp.sum(jnp.exp(t) * (t - s), axis=-1)) * temperature * temperature
    total = 0.0
    for s, t in zip(student, teacher):
        total = total + jnp.mean((s - t) ** 2) / (jnp.mean(t * t) + 1e-12)
    return total / len(student)


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return -jnp.mean(picked)


def _host(tree: dict) -> dict:
    return {k: np.array(v) for k, v in tree.items()}


def _rate_at(step, hyper):
    """The learning rate at a global step: linear warm-up, then cosine decay to 0 at ``steps`` (or constant).
    Everything is an argument (``hyper`` = lr, steps, warmup, cosine?), so the compiled step does not
    depend on the schedule's numbers."""
    lr, total, warm, cosine = hyper[0], hyper[1], hyper[2], hyper[3]
    s = step.astype(jnp.float32)
    warm_factor = jnp.where(warm > 0, jnp.minimum(1.0, s / jnp.maximum(warm, 1.0)), 1.0)
    t = jnp.clip((s - warm) / jnp.maximum(total - warm, 1.0), 0.0, 1.0)
    decay = jnp.where(cosine > 0, 0.5 * (1.0 + jnp.cos(jnp.pi * t)), 1.0)
    return lr * warm_factor * decay


def _sqnr_db(signal_power: float, noise_power: float) -> float:
    if noise_power == 0:
        return float("inf")
    if signal_power == 0:
        return float("-inf")
    return float(10 * math.log10(signal_power / noise_power))


# --- the entry point -------------------------------------------------------------------------------------------
def finetune(model, data, output=None, config: FinetuneConfig | None = None,
             progress: Callable[[FinetuneProgress], None] | None = None) -> FinetuneResult:
    """Train a qtool training graph and write the tuned training graph to ``output``.

    ``model``: path to a graph written by ``qtool rewrite-train`` (or a tuned one).
    ``data``: an ``.npz`` (or a mapping of arrays) with one array per model input,
    plus ``config.labels`` when given. ``output``: where to write (None: train only).
    The input file is never modified.
    """

    config = (config or FinetuneConfig()).normalized()
    _enable_compilation_cache()
    t_start = time.perf_counter()
    notes: list[str] = []

    # --- inputs and their checks, before any work -------------------------------------------------------
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "<model>"
    if output is not None:
        output = check_output_path(output)
        if isinstance(model, (str, os.PathLike)) and os.path.abspath(os.fspath(model)) == output:
            raise QtoolError(f"the output '{output}' is the input file: qtool finetune never overwrites its input; "
                             "choose another output path")
    if isinstance(model, (str, os.PathLike)):
        ir_model = load_model(model).model
    else:
        import onnx_ir as ir

        ir_model = ir.serde.deserialize_model(model) if not isinstance(model, ir.Model) else model.clone()
    if tg.METADATA_KEY not in ir_model.metadata_props:
        raise QtoolError(f"'{label}' is not a qtool training graph (no 'qtool.training' metadata): "
                         "write one with 'qtool rewrite-train' first")
    try:
        contract = tg.training_contract(ir_model)
    except QtoolError as exc:
        raise QtoolError(f"'{label}': {exc}") from exc
    interp = Interpreter(ir_model, label=f"'{label}'")
    roles = _roles(contract, interp)
    options = contract.get("options", {})
    train_ranges = config.train_ranges
    if train_ranges and options.get("symmetric"):
        train_ranges = False
        notes.append("symmetric ranges: activation ranges follow their moving average only (not trained)")
    if roles.freeze_bn_delay is None and contract.get("batch_norms"):
        notes.append("the graph never freezes its batch norms (rewrite-train without --freeze-bn-delay): training "
                     "uses batch statistics, validation too")

    specs = [s for s in input_specs(ir_model) if s.name != roles.step_input and s.name not in interp.initializers]
    train = _load_data(data, specs, config.labels, "training", require_labels=True)
    if config.validation_data is not None:
        val_labels = config.validation_labels or config.labels
        val = _load_data(config.validation_data, specs, val_labels, "validation",
                         require_labels=config.validation_labels is not None)
        val_where = "validation data"
    else:
        val = train
        val_where = "training data"
    metric_name = "accuracy" if val.labels is not None else "sqnr_db"

    # --- where the schedule starts -------------------------------------------------------------------------------
    start_step = 0
    previous = ir_model.metadata_props.get(FINETUNE_METADATA_KEY)
    if config.resume:
        if previous is None:
            raise QtoolError(f"'{label}' was not written by qtool finetune (no '{FINETUNE_METADATA_KEY}' metadata): "
                             "nothing to resume")
        try:
            start_step = int(json.loads(previous)["step"])
        except (ValueError, KeyError, TypeError) as exc:
            raise QtoolError(f"'{label}': its '{FINETUNE_METADATA_KEY}' metadata is not valid ({exc!r})") from exc
        if start_step >= config.steps:
            raise QtoolError(f"'{label}' was already trained to step {start_step}: give --steps larger than that "
                             "to continue the schedule")
    elif previous is not None:
        notes.append("the input was already fine-tuned: the schedule starts again at step 0 (use resume to continue)")
    steps_run = config.steps - start_step

    # --- parameters and state -----------------------------------------------------------------------------------------
    range_names = {n for pair in roles.ranges for n in pair} if train_ranges else set()
    trainable_names = [n for n in roles.parameters if n not in roles.state] + \
        [n for n in roles.state if n in range_names]
    params0 = {n: jnp.asarray(interp.initializers[n]) for n in trainable_names}
    state0 = {n: jnp.asarray(interp.initializers[n]) for n in roles.state if n not in range_names}
    teacher_feed = {n: jnp.asarray(interp.initializers[n]) for n in trainable_names + list(state0)}
    bad = [n for n, v in params0.items() if not jnp.issubdtype(v.dtype, jnp.floating)]
    if bad:
        raise QtoolError(f"'{label}': trainable tensor '{bad[0]}' is not floating point")
    weight_prefixes = tuple(p + "/" for p in roles.weight_prefixes)

    def range_grad(node_name: str) -> bool:  # TF's last-value weight ranges are not trained
        return not node_name.startswith(weight_prefixes)

    step_input = roles.step_input
    data_outputs = roles.data_outputs
    distill_w = config.distillation_weight if config.labels is not None else 1.0

    def forward(feed, batch, step, quantized):
        return interp.run({**feed, **batch, step_input: step}, fake_quant=quantized, range_grad=range_grad)

    # --- the optimizer --------------------------------------------------------------------------------------------------------
    hyper = jnp.asarray([config.learning_rate, config.steps, config.warmup_steps,
                         1.0 if config.schedule == "cosine" else 0.0], jnp.float32)

    # Adam's direction, scaled by the schedule at the global step (a traced argument: a resumed run
    # compiles to the same program, so JAX's compilation cache serves it)
    optimizer = optax.scale_by_adam()
    opt_state = optimizer.init(params0)

    def loss_fn(params, state, batch, labels, step, teacher_out):
        outs = forward({**state, **params}, batch, step, True)
        student = [outs[o] for o in data_outputs]
        loss = 0.0
        if distill_w:
            loss = distill_w * _distill_loss(config.distillation, student, teacher_out, config.temperature)
        if labels is not None:
            loss = loss + _cross_entropy(student[0], labels)
        return loss, outs

    def train_step(params, state, opt_state, teacher_feed, batch, labels, step, hyper):
        teacher = forward(teacher_feed, batch, jnp.int32(_TEACHER_STEP), False)
        teacher_out = [jax.lax.stop_gradient(teacher[o]) for o in data_outputs]
        (loss, outs), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, batch, labels, step,
                                                                        teacher_out)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        rate = _rate_at(step, hyper)
        new_params = {}
        for name, value in params.items():
            base_value = outs[roles.state[name]] if name in roles.state else value
            new_params[name] = base_value - rate * updates[name]
        for lo_name, hi_name in roles.ranges:
            if lo_name in new_params and hi_name in new_params:
                lo = jnp.minimum(new_params[lo_name], 0.0)
                hi = jnp.maximum(new_params[hi_name], 0.0)
                new_params[lo_name] = lo
                new_params[hi_name] = jnp.maximum(hi, lo + _MIN_RANGE)
        new_state = {name: outs[roles.state[name]] for name in state}
        return new_params, new_state, opt_state, loss

    donate = () if jax.default_backend() == "cpu" else (0, 1, 2)  # CPU buffers cannot be donated
    train_step_jit = jax.jit(train_step, donate_argnums=donate)

    eval_step_value = max(start_step, roles.quant_delay, roles.freeze_bn_delay or 0, _TEACHER_STEP)

    def eval_outputs(params, state, batch):
        q = forward({**state, **params}, batch, jnp.int32(eval_step_value), True)
        return [q[o] for o in data_outputs]

    eval_jit = jax.jit(eval_outputs)
    teacher_jit = jax.jit(lambda feed, batch: [forward(feed, batch, jnp.int32(_TEACHER_STEP), False)[o]
                                                for o in data_outputs])

    eval_batch = val.fixed_batch or min(val.num, 256)

    def val_batches():
        for s in range(0, val.num, eval_batch):
            yield s, {k: jnp.asarray(v[s:s + eval_batch]) for k, v in val.inputs.items()}

    teacher_cache = [teacher_jit(teacher_feed, b) for _, b in val_batches()]

    def metric(params, state) -> float:
        correct = 0
        signal = noise = 0.0
        for (s, b), t in zip(val_batches(), teacher_cache):
            q = eval_jit(params, state, b)
            if metric_name == "accuracy":
                pred = np.asarray(jnp.argmax(q[0], axis=-1))
                correct += int(np.sum(pred == val.labels[s:s + eval_batch]))
            else:
                for qo, to in zip(q, t):
                    qo, to = np.asarray(qo, np.float64), np.asarray(to, np.float64)
                    signal += float(np.sum(to * to))
                    noise += float(np.sum((qo - to) ** 2))
        return correct / val.num if metric_name == "accuracy" else _sqnr_db(signal, noise)

    def float_metric() -> float:
        if metric_name != "accuracy":
            return float("inf")
        correct = 0
        for (s, _), t in zip(val_batches(), teacher_cache):
            correct += int(np.sum(np.asarray(jnp.argmax(t[0], axis=-1)) == val.labels[s:s + eval_batch]))
        return correct / val.num

    params = dict(params0)
    state = dict(state0)
    before = metric(params, state)
    float_value = float_metric()
    best = (before, start_step, _host(params), _host(state))

    # --- the loop ---------------------------------------------------------------------------------------------------------
    batch_size = min(config.batch_size, train.num)
    if train.fixed_batch and train.fixed_batch != config.batch_size:
        batch_size = train.fixed_batch
        notes.append(f"the model's inputs have a fixed batch size of {batch_size}: using it")
    elif batch_size < config.batch_size:
        notes.append(f"batch size {config.batch_size} is more than the {train.num} samples: using {batch_size}")
    rng = np.random.default_rng([config.seed, start_step])
    order = rng.permutation(train.num)
    cursor = 0
    every = config.validate_every or max(1, steps_run // 10)
    report_every = max(1, steps_run // 50)
    history = []
    loss_first = loss_last = None
    compile_seconds = 0.0
    t_loop = time.perf_counter()
    t_after_first = None
    for i in range(steps_run):
        step = start_step + i
        if cursor + batch_size > train.num:
            order = rng.permutation(train.num)
            cursor = 0
        idx = np.sort(order[cursor:cursor + batch_size])
        cursor += batch_size
        batch = {k: jnp.asarray(v[idx]) for k, v in train.inputs.items()}
        labels = None if train.labels is None else jnp.asarray(train.labels[idx].astype(np.int32))
        t0 = time.perf_counter()
        params, state, opt_state, loss = train_step_jit(params, state, opt_state, teacher_feed, batch, labels,
                                                        jnp.int32(step), hyper)
        loss = float(loss)
        if i == 0:
            compile_seconds = time.perf_counter() - t0
            t_after_first = time.perf_counter()
            loss_first = loss
        loss_last = loss
        if not math.isfinite(loss):
            raise QtoolError(f"the loss became {loss} at step {step}: lower the learning rate "
                             f"(now {config.learning_rate:g})")
        done = i + 1
        elapsed = time.perf_counter() - t_loop
        eta = None
        if done > 1:
            eta = (time.perf_counter() - t_after_first) / (done - 1) * (steps_run - done)
        validate = done % every == 0 or done == steps_run
        m = metric(params, state) if validate else None
        if validate:
            history.append({"step": step + 1, "loss": loss, metric_name: m})
            if m > best[0] or not config.keep_best:
                best = (m, step + 1, _host(params), _host(state))
        if progress is not None and (validate or done % report_every == 0 or done == 1):
            progress(FinetuneProgress(step + 1, config.steps, loss, elapsed, eta, metric_name if validate else None, m))
    loop_seconds = time.perf_counter() - t_loop
    last = history[-1][metric_name] if history else before
    after, best_step, best_params, best_state = best
    if config.keep_best and best_step != config.steps:
        notes.append(f"kept the values of step {best_step} ({metric_name} {_fmt_metric(metric_name, after)}), "
                     f"better than the last step's ({_fmt_metric(metric_name, last)})")
    per_step = (time.perf_counter() - t_after_first) / max(1, steps_run - 1) if steps_run > 1 else loop_seconds

    # --- write back -------------------------------------------------------------------------------------------------------
    end_step = config.steps
    if output is not None:

        _write_back(ir_model, {**best_params, **best_state}, {
            "version": 1,
            "step": end_step,
            "best_step": best_step,
            "schedule": {"steps": config.steps, "learning_rate": config.learning_rate, "schedule": config.schedule,
                         "warmup_steps": config.warmup_steps},
            "seed": config.seed,
            "labels": config.labels,
            "distillation": config.distillation,
            "metric": {"name": metric_name, "before": before, "after": after, "float": float_value},
        })
        save_model(ir_model, output)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    n_values = int(sum(int(np.prod(v.shape)) for v in params0.values()))
    return FinetuneResult(
        input=label, output=output, metric_name=metric_name, metric_source=val_where,
        before=before, after=after, float_metric=float_value, start_step=start_step, end_step=end_step,
        steps_run=steps_run, seconds=time.perf_counter() - t_start, compile_seconds=compile_seconds,
        seconds_per_step=per_step, peak_rss_mb=peak, loss_first=loss_first, loss_last=loss_last, best_step=best_step,
        parameters=len(params0), parameter_values=n_values, config=config.to_dict(), history=history, notes=notes,
    )


def _enable_compilation_cache() -> None:
    """JAX's persistent compilation cache (XLA takes seconds to compile a training step): a second run
    of the same graph with the same shapes starts at once. ``QTOOL_JAX_CACHE``: the folder, or 0 for none;
    default ``$XDG_CACHE_HOME/qtool/jax`` (``~/.cache/qtool/jax``). A cache the user set up is left alone."""
    setting = os.environ.get("QTOOL_JAX_CACHE")
    if setting == "0" or jax.config.jax_compilation_cache_dir:
        return
    if not setting:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        setting = os.path.join(base, "qtool", "jax")
    try:
        os.makedirs(setting, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", setting)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _write_back(ir_model, values: Mapping[str, object], record: dict) -> None:
    """Trained values into the initializers of the same name (dtype kept); the record as metadata."""
    import onnx_ir as ir

    for name, value in values.items():
        init = ir_model.graph.initializers[name]
        old = init.const_value
        array = np.asarray(value).astype(old.dtype.numpy(), copy=False).reshape(tuple(int(d) for d in old.shape))
        init.const_value = ir.Tensor(np.array(array, order="C"), name=name)  # (ascontiguousarray makes 0-d 1-d)
    ir_model.metadata_props[FINETUNE_METADATA_KEY] = json.dumps(record, sort_keys=True)
