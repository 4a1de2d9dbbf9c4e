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
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax
from onnx import TensorProto

from qtool.data import CalibrationData, input_specs, load_calibration_data, same_feeds
from qtool.errors import QtoolError
from qtool.finetune.config import (
    AUTO,
    FINETUNE_METADATA_KEY,
    LEARNING_RATE_CANDIDATES,
    FinetuneConfig,
    FinetuneProgress,
    FinetuneResult,
    _fmt_metric,
)
from qtool.finetune.interpreter import Interpreter, bodies
from qtool.finetune.segmented import SegmentedGraph, split
from qtool.model.io import check_output_path, load_model, save_model
from qtool.onnx_rewrite import train_graph as tg

MAX_SKIPPED = 5  # consecutive steps with non-finite gradients skipped before the run gives up
_TEACHER_STEP = 2**30  # past every delay: batch norms frozen (quantization is off for the teacher anyway)
_MIN_RANGE = 1e-6


# --- data ---------------------------------------------------------------------------------------
@dataclass
class _Group:
    """The samples of one shape (a folder's files may differ in dynamic dimensions; a single file is one group),
    read whole: training samples batches in random order (calibration streams them)."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    num: int


@dataclass
class _Data:
    groups: list[_Group]  # by shape, in the data's order (``CalibrationData.shape_groups``)
    source: str
    loaded: CalibrationData  # how each input is fed (its batch axis), the model's static batch size

    @property
    def num(self) -> int:
        return sum(g.num for g in self.groups)

    @property
    def has_labels(self) -> bool:
        """Whether the data has labels (each shape group holds its own)."""
        return self.groups[0].labels is not None

    @property
    def fixed_batch(self) -> int | None:
        return self.loaded.fixed_batch

    @property
    def fixed(self) -> dict[str, np.ndarray]:
        """The inputs with no batch axis (a sample rate, a static initial state): one array fed whole with every
        batch, so the same over the whole dataset. They stay on the host, constants at trace time: an ``If`` on
        the sample rate runs only its taken branch, shapes computed from them stay static."""
        specs = self.loaded.specs
        return {k: v for k, v in self.groups[0].inputs.items() if k in specs and specs[k].batch_axis is None}

    def feed(self, rows, group: _Group | None = None) -> dict:
        """The model's batched inputs for ``rows`` (a slice or sorted indices) of ``group`` (default: the first
        shape's), on the device (the :attr:`fixed` ones are not fed: the compiled functions hold them)."""
        fixed = self.fixed
        inputs = (group or self.groups[0]).inputs
        return {k: jnp.asarray(v) for k, v in self.loaded.select(inputs, rows).items() if k not in fixed}


_MANY_SHAPES = 4  # more shape groups than this: a note on the compiles they cost


def _load_data(source, specs, labels_key: str | None, what: str, require_labels: bool) -> _Data:

    try:
        data = load_calibration_data(source, specs)
    except QtoolError as exc:
        raise QtoolError(str(exc).replace("calibration data", f"{what} data").replace("calibration arrays",
                                                                                      f"{what} arrays")) from exc
    groups = [_Group(data.read_group(group), None, sum(p.num_samples for p in group))
              for group in data.shape_groups()]
    if labels_key is not None:
        for group, parts in zip(groups, data.shape_groups()):
            group.labels = _labels(source, data, parts, labels_key, what)
        if any(g.labels is None for g in groups):
            if require_labels:
                lacking = next((p.source for p in data.files() if p.members is None or labels_key not in p.members),
                               None) if data.parts else data.source
                raise QtoolError(f"{what} data '{lacking or '<arrays>'}' has no array '{labels_key}' (--labels)")
            for group in groups:
                group.labels = None
    fixed = [{k: v for k, v in g.inputs.items() if data.specs[k].batch_axis is None} for g in groups]
    if not all(same_feeds(f, fixed[0]) for f in fixed):
        raise QtoolError(f"{what} data '{data.source}': the inputs without a batch axis "
                         f"({', '.join(fixed[0])}) differ between its files; fine-tuning compiles them as constants: "
                         "give files with the same values")
    return _Data(groups, data.source or "<arrays>", data)


def _labels(source, data: CalibrationData, parts: list, key: str, what: str) -> np.ndarray | None:
    """The labels ``key`` of a shape group, checked (None: the data has none)."""
    if data.parts:
        labels = data.read_array(key, parts)
    elif isinstance(source, (str, os.PathLike)):
        if data.members is None:
            raise QtoolError(f"{what} data '{os.fspath(source)}' is a single array: labels ('{key}') "
                             "need an .npz holding the inputs and the labels")
        labels = data.read_array(key)
    elif isinstance(source, Mapping):
        labels = np.asarray(source[key]) if key in source else None
    else:
        labels = None
    if labels is None:
        return None
    num = sum(p.num_samples for p in parts)
    if labels.shape[:1] != (num,):
        raise QtoolError(f"{what} labels '{key}' have {labels.shape[0] if labels.ndim else 0} "
                         f"entries for {num} samples")
    if labels.dtype.kind not in "iu":
        raise QtoolError(f"{what} labels '{key}' must be integer class ids, got {labels.dtype}")
    return labels


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
    range_update: str | None = None  # the input that holds the activation ranges when fed 0 (validation)
    bounds: dict = field(default_factory=dict)  # min state name -> (lo, hi) where its readers saturate


def _bound(bound, initial) -> tuple[float, float]:
    """A contract's ``bound`` ([lo, hi], null for unbounded) as numbers, widened to the initial range
    (``rewrite-train`` starts one grid step beyond the bound, where the readers saturate)."""
    lo = -math.inf if bound[0] is None else float(bound[0])
    hi = math.inf if bound[1] is None else float(bound[1])
    if initial:
        lo, hi = min(lo, float(initial[0])), max(hi, float(initial[1]))
    return lo, hi


_FLOATING = (TensorProto.UNDEFINED, TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _roles(contract: dict, interp: Interpreter) -> _Roles:
    try:
        state = dict(contract["state"])
        parameters = [p for p in contract.get("parameters", [])]
        ranges = [(q["min"], q["max"]) for q in contract.get("activation_quantizers", [])]
        bounds = {q["min"]: _bound(q["bound"], q.get("initial_range"))
                  for q in contract.get("activation_quantizers", []) if q.get("bound")}
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
    # what the network computes: its float outputs (integer inputs passed through, as a sentence-transformers
    # export returns its input_ids and attention_mask, are no signal to distil, validate or take logits from)
    data_outputs = [o for o in interp.output_names if o not in updated and interp.output_types.get(o) in _FLOATING]
    if not data_outputs:
        raise QtoolError(f"{interp.label}: the graph has no float output besides its state updates")
    range_update = contract.get("range_update_input")
    if range_update is not None and range_update not in interp.feedable:
        raise QtoolError(f"{interp.label}: the range-update input '{range_update}' is not a graph input with a default")
    return _Roles(step_input, state, parameters, ranges, weight_prefixes, data_outputs, quant_delay, freeze,
                  range_update, bounds)


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


def _schedule(rate: float, steps: int, warmup: int, schedule: str, origin: int = 0) -> jax.Array:
    """The schedule's numbers as the compiled step's ``hyper`` argument (see ``_rate_at``)."""
    return jnp.asarray([rate, steps, warmup, 1.0 if schedule == "cosine" else 0.0, origin], jnp.float32)


def _rate_at(step, hyper):
    """The learning rate at a global step: linear warm-up, then cosine decay to 0 at ``steps`` (or constant),
    counted from the step ``origin`` (0: the schedule is in global steps; a probe starts its own). Everything is
    an argument (``hyper`` = lr, steps, warmup, cosine?, origin), so the compiled step does not depend on the
    schedule's numbers: a resumed run and every learning-rate probe run the same program."""
    lr, total, warm, cosine, origin = hyper[0], hyper[1], hyper[2], hyper[3], hyper[4]
    s = step.astype(jnp.float32) - origin
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

    output = _check_output(model, output)
    graph = _open_graph(model, config, notes)
    train, val, val_where = _open_data(data, config, graph)
    start_step = _start_step(graph, config, notes)
    run = _build_run(graph, config, start_step, train.fixed)
    batch_size = _batch_size(config, train, notes)
    validator = _build_validator(run, val, batch_size)
    before = validator.metric(run.params0, run.state0)
    rate, probes, probe_compile = config.learning_rate, [], None
    if rate == AUTO:
        rate, probes, probe_compile = _probe_rates(run, train, batch_size, validator, before, progress, notes)
    if rate is None:
        trained = _untrained(run, validator, before)
    else:
        trained = _train(run, rate, before, train, batch_size, validator, progress, notes)
    if probe_compile is not None:  # the probes compiled the step
        trained.compile_seconds = probe_compile
    if output is not None:
        _save_tuned(graph.ir_model, output, config, trained, validator.metric_name, graph.roles.range_update,
                    rate, probes)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    n_values = int(sum(int(np.prod(v.shape)) for v in run.params0.values()))
    return FinetuneResult(
        input=graph.label, output=output, metric_name=validator.metric_name, metric_source=val_where,
        before=trained.before, after=trained.after, float_metric=trained.float_metric, start_step=start_step,
        end_step=trained.end_step, steps_run=trained.end_step - start_step, seconds=time.perf_counter() - t_start,
        compile_seconds=trained.compile_seconds, seconds_per_step=trained.seconds_per_step, peak_rss_mb=peak,
        loss_first=trained.loss_first, loss_last=trained.loss_last, best_step=trained.best_step,
        parameters=len(run.params0), parameter_values=n_values, learning_rate=rate, learning_rate_probe=probes,
        config=config.to_dict(), history=trained.history, notes=notes,
    )


# --- the graph and its contract ------------------------------------------------------------------------------------
@dataclass
class _Graph:
    label: str  # the model's path, or "<model>"
    ir_model: object  # a copy (or the loaded file): the trained values are written into it
    contract: dict
    interp: Interpreter
    roles: _Roles
    train_ranges: bool  # the config's, off for symmetric ranges


def _model_label(model) -> str:
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else "<model>"


def _check_output(model, output):
    """The output path, checked before any work (None: train only); never the input file."""
    if output is None:
        return None
    output = check_output_path(output)
    if isinstance(model, (str, os.PathLike)) and os.path.abspath(os.fspath(model)) == output:
        raise QtoolError(f"the output '{output}' is the input file: qtool finetune never overwrites its input; "
                         "choose another output path")
    return output


def _read_model(model, label: str):
    """The model as an onnx-ir model of its own (a path is loaded, a model is copied) and its training contract."""
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
    return ir_model, contract


def _open_graph(model, config: FinetuneConfig, notes: list[str]) -> _Graph:
    label = _model_label(model)
    ir_model, contract = _read_model(model, label)
    interp = Interpreter(ir_model, label=f"'{label}'")
    roles = _roles(contract, interp)
    options = contract.get("options", {})
    train_ranges = config.train_ranges
    if train_ranges and options.get("symmetric"):
        train_ranges = False
        notes.append("symmetric ranges: activation ranges follow their moving average only (not trained)")
    if roles.freeze_bn_delay is None and contract.get("batch_norms"):
        notes.append("the graph never freezes its batch norms (rewrite-train without --freeze-bn-delay): training "
                     "uses batch statistics, validation too (in batches of at most the training batch size)")
    return _Graph(label, ir_model, contract, interp, roles, train_ranges)


def _open_data(data, config: FinetuneConfig, graph: _Graph) -> tuple[_Data, _Data, str]:
    """The training data, the validation data (the training data when none is given) and where it comes from."""
    specs = [s for s in input_specs(graph.ir_model)
             if s.name != graph.roles.step_input and s.name not in graph.interp.initializers]
    train = _load_data(data, specs, config.labels, "training", require_labels=True)
    if config.validation_data is None:
        return train, train, "training data"
    val_labels = config.validation_labels or config.labels
    val = _load_data(config.validation_data, specs, val_labels, "validation",
                     require_labels=config.validation_labels is not None)
    return train, val, "validation data"


# --- where the schedule starts -------------------------------------------------------------------------------
def _start_step(graph: _Graph, config: FinetuneConfig, notes: list[str]) -> int:
    """0, or with ``resume`` the step recorded in the input's ``qtool.finetune`` metadata."""
    label = graph.label
    previous = graph.ir_model.metadata_props.get(FINETUNE_METADATA_KEY)
    if not config.resume:
        if previous is not None:
            notes.append("the input was already fine-tuned: the schedule starts again at step 0 "
                         "(use resume to continue)")
        return 0
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
    return start_step


# --- the JAX step ------------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """What the training loop and the validation share: the contract's roles, the starting values and the
    compiled training step."""

    config: FinetuneConfig
    roles: _Roles
    start_step: int
    params0: dict  # trained by the optimizer: the parameters (and the activation ranges, when trained)
    state0: dict  # the rest of the state: each step's `:updated` output
    teacher_feed: dict  # the parameters and state the run started from
    forward: Callable  # (feed, batch, step, quantized) -> every graph output
    opt_state: object
    train_step: Callable  # jitted (params, state, opt_state, teacher_feed, batch, labels, step, hyper)
    fixed: dict  # the training data's inputs without a batch axis (constants of the compiled programs)
    teacher: Callable  # (teacher_feed, batch) -> the float teacher's data outputs (see _outputs_fn)

    @property
    def steps_run(self) -> int:
        return self.config.steps - self.start_step


def _build_run(graph: _Graph, config: FinetuneConfig, start_step: int, fixed: dict) -> _Run:
    params0, state0, teacher_feed = _initial_values(graph)
    forward = _forward_fn(graph)
    optimizer = _optimizer()
    opt_state = optimizer.init(params0)
    teacher = _outputs_fn(forward, False, _TEACHER_STEP, graph.roles.data_outputs, fixed)
    train_step = _train_step_fn(forward, graph.roles, config, optimizer, fixed, frozenset(params0), teacher)
    return _Run(config, graph.roles, start_step, params0, state0, teacher_feed, forward, opt_state, train_step, fixed,
                teacher)


def _optimizer():
    """Adam's direction (the update scales it by the schedule at the global step: a traced argument, so a resumed
    run compiles to the same program and JAX's compilation cache serves it). A step whose gradients are not
    finite is skipped (optax.apply_if_finite: no update, Adam's moments kept) rather than poisoning every
    parameter; MAX_SKIPPED in a row and the update goes through (the loss then stops the run with its message).
    Over the parameters raveled into one vector (optax.flatten): per tensor, the finiteness check and Adam were
    kernels of their own for every weight and range (PP-OCRv6 tiny's step: 18% fewer StableHLO ops, 7% fewer
    kernels; the same arithmetic per element)."""
    return optax.flatten(optax.apply_if_finite(optax.scale_by_adam(), max_consecutive_errors=MAX_SKIPPED))


def _initial_values(graph: _Graph) -> tuple[dict, dict, dict]:
    """The trainable tensors, the rest of the state, and the teacher's feed (both), from the initializers."""
    roles, interp = graph.roles, graph.interp
    range_names = {n for pair in roles.ranges for n in pair} if graph.train_ranges else set()
    trainable_names = [n for n in roles.parameters if n not in roles.state] + \
        [n for n in roles.state if n in range_names]
    params0 = {n: jnp.asarray(interp.initializers[n]) for n in trainable_names}
    state0 = {n: jnp.asarray(interp.initializers[n]) for n in roles.state if n not in range_names}
    teacher_feed = {n: jnp.asarray(interp.initializers[n]) for n in trainable_names + list(state0)}
    bad = [n for n, v in params0.items() if not jnp.issubdtype(v.dtype, jnp.floating)]
    if bad:
        raise QtoolError(f"'{graph.label}': trainable tensor '{bad[0]}' is not floating point")
    return params0, state0, teacher_feed


@dataclass
class _Forward:
    """The graph as a JAX function of (feed, batch, step, quantized) -> every graph output; weight ranges get no
    gradient. :meth:`feeds` and :meth:`options` are the interpreter's feeds and context (a segmented step runs
    the graph's nodes in parts with them)."""

    interp: Interpreter
    step_input: str
    moving: dict  # training moves the activation ranges (TF's EMA) whatever the file's default (a tuned file holds)
    weight_prefixes: tuple
    no_grad: frozenset
    trainable: frozenset

    def range_grad(self, node_name: str) -> bool:  # TF's last-value weight ranges are not trained
        return not node_name.startswith(self.weight_prefixes)

    def feeds(self, feed, batch, step) -> dict:
        return {**self.moving, **feed, **batch, self.step_input: step}

    def options(self, quantized: bool) -> dict:
        return {"fake_quant": quantized, "range_grad": self.range_grad, "no_grad": self.no_grad,
                "trainable": self.trainable}

    def __call__(self, feed, batch, step, quantized):
        return self.interp.run(self.feeds(feed, batch, step), **self.options(quantized))


def _forward_fn(graph: _Graph) -> _Forward:
    roles = graph.roles
    moving = {} if roles.range_update is None else {roles.range_update: jnp.float32(1.0)}
    trainable = frozenset(roles.parameters) | {n for pair in roles.ranges for n in pair}
    return _Forward(graph.interp, roles.step_input, moving, tuple(p + "/" for p in roles.weight_prefixes),
                    _moving_average_inputs(graph.interp, roles), trainable)


def _outputs_fn(forward: _Forward, quantized: bool, step: int, outputs: list, fixed: dict) -> Callable:
    """(feed, batch) -> the graph's ``outputs`` at the global ``step``, with no gradient (the teacher, the validation
    forward): one jitted program, or for a graph of more than ``SEGMENT_NODES`` nodes its segments run forward
    only, each compiled alone (:mod:`qtool.finetune.segmented`). ``fixed``: constants of the compiled programs."""
    chunks = split(forward.interp.nodes)
    if len(chunks) == 1:
        return jax.jit(lambda feed, batch: [forward(feed, {**batch, **fixed}, jnp.int32(step), quantized)[o]
                                            for o in outputs])
    graph = SegmentedGraph(forward.interp, chunks, forward.options(quantized), outputs, frozenset())

    def run(feed, batch):
        values = graph.forward(forward.feeds(feed, {**batch, **fixed}, jnp.int32(step)))
        return [values[o] for o in outputs]

    return run


def _moving_average_inputs(interp, roles: _Roles) -> frozenset:
    """The batch ranges the activation ranges' moving averages read (``<q>/AssignMinEma/delta`` is
    ``Sub(<q>/min, batch range)``; ``<q>/AssignMinEma`` is ``Sub(<q>/min, Mul(delta, decay))``): their
    gradient stops there, as TensorFlow's does at the ``AssignSub`` of ``assign_moving_average`` (not
    differentiable). Without the stop, a trained range's gradient reached the activation through
    ``ReduceMin``/``ReduceMax`` (at the batch's extreme elements, scaled by the decay): a term TF's
    straight-through gradient does not have (spec section 7)."""
    states = {name for pair in roles.ranges for name in pair}
    nodes = list(_all_nodes(interp.nodes))  # an If branch's quantizers too (rewrite-train's train_branches)
    producer = {out: node for node in nodes for out in node.outputs}
    subs = [n for n in nodes if n.op_type == "Sub" and n.domain == "" and n.inputs[0] in states]
    deltas = {n.outputs[0] for n in subs}

    def is_update(node) -> bool:  # Sub(state, Mul(delta, decay)): the assignment, not the delta
        made = producer.get(node.inputs[1])
        return made is not None and made.op_type == "Mul" and any(i in deltas for i in made.inputs)

    return frozenset(n.inputs[1] for n in subs if not is_update(n))


def _all_nodes(nodes):
    """``nodes`` and the nodes of their subgraphs, at any depth."""
    for node in nodes:
        yield node
        for body in bodies(node):
            yield from _all_nodes(body.nodes)


def _train_step_fn(forward: _Forward, roles: _Roles, config: FinetuneConfig, optimizer, fixed: dict,
                   trained: frozenset, teacher: Callable) -> Callable:
    """The training step: teacher, loss and gradients, the optimizer's update, the next state; one jitted
    program, or for a graph of more than ``SEGMENT_NODES`` nodes the graph's segments jitted one by one
    (:mod:`qtool.finetune.segmented`; ``teacher``, segmented too, runs before them). ``fixed``: the data's inputs
    without a batch axis, constants of the compiled step; ``trained``: the names of the parameters (the
    optimizer's)."""
    loss_of, update = _loss_fn(roles, config), _update_fn(roles, optimizer)
    chunks = split(forward.interp.nodes)
    if len(chunks) > 1:
        return _segmented_step_fn(forward, roles, chunks, loss_of, update, fixed, trained, teacher)
    data_outputs = roles.data_outputs

    def loss_fn(params, state, batch, labels, step, teacher_out):
        outs = forward({**state, **params}, batch, step, True)
        return loss_of([outs[o] for o in data_outputs], teacher_out, labels), outs

    def train_step(params, state, opt_state, teacher_feed, batch, labels, step, hyper):
        batch = {**batch, **fixed}
        teacher = forward(teacher_feed, batch, jnp.int32(_TEACHER_STEP), False)
        teacher_out = [jax.lax.stop_gradient(teacher[o]) for o in data_outputs]
        (loss, outs), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, batch, labels, step,
                                                                        teacher_out)
        new_params, opt_state = update(params, grads, opt_state, outs, step, hyper)
        new_state = {name: outs[roles.state[name]] for name in state}
        return new_params, new_state, opt_state, loss

    donate = () if jax.default_backend() == "cpu" else (0, 1, 2)  # CPU buffers cannot be donated
    return jax.jit(train_step, donate_argnums=donate)


def _segmented_step_fn(forward: _Forward, roles: _Roles, chunks: list, loss_of: Callable, update: Callable,
                       fixed: dict, trained: frozenset, teacher: Callable) -> Callable:
    """The training step of :func:`_train_step_fn` with the student's forward and backward run segment by
    segment; the teacher (its segments forward only), the loss's gradient and the update are programs of their
    own."""
    data_outputs = roles.data_outputs
    wanted = list(dict.fromkeys(data_outputs + list(roles.state.values())))
    student = SegmentedGraph(forward.interp, chunks, forward.options(True), wanted, trained)
    loss_grad = jax.jit(jax.value_and_grad(loss_of))
    update = jax.jit(update)

    def train_step(params, state, opt_state, teacher_feed, batch, labels, step, hyper):
        teacher_out = teacher(teacher_feed, batch)
        outs, backward = student.forward_vjp(forward.feeds({**state, **params}, {**batch, **fixed}, step))
        loss, cotangents = loss_grad([outs[o] for o in data_outputs], teacher_out, labels)
        grads = backward(dict(zip(data_outputs, cotangents)))
        ranges = {roles.state[n]: outs[roles.state[n]] for n in params if n in roles.state}
        new_params, opt_state = update(params, grads, opt_state, ranges, step, hyper)
        new_state = {name: outs[roles.state[name]] for name in state}
        return new_params, new_state, opt_state, loss

    return train_step


def _loss_fn(roles: _Roles, config: FinetuneConfig) -> Callable:
    """(student's data outputs, teacher's, labels) -> the loss: distillation, plus cross-entropy with labels."""
    distill_w = config.distillation_weight if config.labels is not None else 1.0

    def loss_of(student, teacher_out, labels):
        loss = 0.0
        if distill_w:
            loss = distill_w * _distill_loss(config.distillation, student, teacher_out, config.temperature)
        if labels is not None:
            loss = loss + _cross_entropy(student[0], labels)
        return loss

    return loss_of


def _update_fn(roles: _Roles, optimizer) -> Callable:
    """(params, grads, opt_state, outputs, step, hyper) -> the new params and optimizer state: Adam's step at the
    schedule's rate; a trained activation range steps from its moving average (its ``:updated`` output) and
    stays within its bound."""

    def update(params, grads, opt_state, outs, step, hyper):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        rate = _rate_at(step, hyper)
        new_params = {}
        for name, value in params.items():
            base_value = outs[roles.state[name]] if name in roles.state else value
            new_params[name] = base_value - rate * updates[name]
        for lo_name, hi_name in roles.ranges:
            if lo_name in new_params and hi_name in new_params:
                # within the bound the graph clips its batch ranges to (rewrite-eval clips to it as well)
                bound_lo, bound_hi = roles.bounds.get(lo_name, (-math.inf, math.inf))
                lo = jnp.clip(new_params[lo_name], bound_lo, 0.0)
                hi = jnp.clip(new_params[hi_name], 0.0, bound_hi)
                new_params[lo_name] = lo
                new_params[hi_name] = jnp.maximum(hi, lo + _MIN_RANGE)
        return new_params, opt_state

    return update


# --- validation --------------------------------------------------------------------------------------------------
@dataclass
class _Validator:
    """The validation metric: accuracy with labels, else the SQNR of the quantized outputs against the
    teacher's (computed once)."""

    val: _Data
    metric_name: str
    eval_batch: int
    eval_outputs: Callable  # (params, state, batch) -> the quantized data outputs (see _outputs_fn)
    teacher_cache: list  # the teacher's data outputs, one list per validation batch

    def batches(self):
        """``(labels or None, feed)`` of each validation batch, shape group by shape group."""
        for group in self.val.groups:
            for s in range(0, group.num, self.eval_batch):
                rows = slice(s, s + self.eval_batch)
                yield None if group.labels is None else group.labels[rows], self.val.feed(rows, group)

    def metric(self, params, state) -> float:
        correct = 0
        signal = noise = 0.0
        for (labels, b), t in zip(self.batches(), self.teacher_cache):
            q = self.eval_outputs(params, state, b)
            if self.metric_name == "accuracy":
                pred = np.asarray(jnp.argmax(q[0], axis=-1))
                correct += int(np.sum(pred == labels))
            else:
                for qo, to in zip(q, t):
                    qo, to = np.asarray(qo, np.float64), np.asarray(to, np.float64)
                    signal += float(np.sum(to * to))
                    noise += float(np.sum((qo - to) ** 2))
        return correct / self.val.num if self.metric_name == "accuracy" else _sqnr_db(signal, noise)

    def float_metric(self) -> float:
        if self.metric_name != "accuracy":
            return float("inf")
        correct = 0
        for (labels, _), t in zip(self.batches(), self.teacher_cache):
            correct += int(np.sum(np.asarray(jnp.argmax(t[0], axis=-1)) == labels))
        return correct / self.val.num


def _build_validator(run: _Run, val: _Data, batch_size: int) -> _Validator:
    """The validator, validating in batches of the model's fixed batch size, else of at most the training batch
    size (one sample when training takes one at a time: a model that declares a free batch axis but runs one
    sample, khmersm): its memory is a training batch's, and where the graph never freezes its batch norms the
    validation normalizes over batches of the size training does. The teacher and the validation forward are
    segmented as the training step is (a graph of more than ``SEGMENT_NODES`` nodes); the teacher is the training
    step's own where the data's fixed inputs are the same (its compiled segments serve both)."""
    forward, data_outputs, roles = run.forward, run.roles.data_outputs, run.roles
    eval_step_value = max(run.start_step, roles.quant_delay, roles.freeze_bn_delay or 0, _TEACHER_STEP)

    # validation computes what rewrite-eval deploys: the stored ranges, not ranges moved by this batch
    held = {} if roles.range_update is None else {roles.range_update: jnp.float32(0.0)}
    quantized = _outputs_fn(forward, True, eval_step_value, data_outputs, val.fixed)
    teacher = run.teacher if same_feeds(val.fixed, run.fixed) else _outputs_fn(forward, False, _TEACHER_STEP,
                                                                                   data_outputs, val.fixed)
    metric_name = "accuracy" if val.has_labels else "sqnr_db"
    eval_batch = val.fixed_batch or _even_batch(max(g.num for g in val.groups), batch_size)
    validator = _Validator(val, metric_name, eval_batch,
                           lambda params, state, batch: quantized({**state, **params, **held}, batch), [])
    try:
        validator.teacher_cache = [teacher(run.teacher_feed, b) for _, b in validator.batches()]
    except QtoolError as exc:
        raise _one_sample_error(lambda b: teacher(run.teacher_feed, b), val, eval_batch) or exc
    return validator


def _even_batch(num: int, most: int) -> int:
    """Validation batches of up to ``most`` samples, all of one size where ``num`` has a divisor from ``most / 2``
    to ``most`` (500 samples at most 256: 2 x 250, not 256 + 244): each batch size is a compile of the validation
    and the teacher."""
    if num <= most:
        return num
    return next((d for d in range(most, most // 2 - 1, -1) if num % d == 0), most)


def _one_sample_error(forward: Callable, val: _Data, size: int) -> QtoolError | None:
    """The error to give when the model failed on a batch of ``size`` but runs on one sample: its inputs
    declare a free batch axis, its graph was exported for one sample (a Reshape to a batch of 1 in khmersm's
    transformer). None when one sample fails too (the batch size is not the cause)."""
    if min(size, val.groups[0].num) <= 1:
        return None
    try:
        forward(val.feed(slice(0, 1)))
    except QtoolError:
        return None
    return QtoolError(f"the model runs on one sample but fails on a batch of {min(size, val.groups[0].num)} (its inputs "
                      "declare a free batch size, its graph does not take one): fine-tune with --batch-size 1 "
                      "(validation then runs one sample at a time too)")


# --- the training loop -----------------------------------------------------------------------------------------
@dataclass
class _Trained:
    """What the loop reached: the metric before and after, the values kept (the best, or the last), timings."""

    before: float
    float_metric: float
    best: tuple  # (metric, step, params on the host, state on the host)
    end_step: int = 0  # the step the schedule reached
    history: list = field(default_factory=list)
    loss_first: float | None = None
    loss_last: float | None = None
    compile_seconds: float = 0.0
    seconds_per_step: float = 0.0

    @property
    def after(self) -> float:
        return self.best[0]

    @property
    def best_step(self) -> int:
        return self.best[1]


class _Batches:
    """Training batches in random order: a fresh permutation whenever the current one runs out. A batch holds
    samples of one shape: each shape group's permutation is cut into batches (of all of a group smaller than
    the batch size), and the batches of several groups are shuffled together."""

    def __init__(self, train: _Data, batch_size: int, rng: np.random.Generator):
        self.train, self.batch_size, self.rng = train, batch_size, rng
        self.plan: list[tuple[_Group, np.ndarray]] = []
        self.seen: set[int] = set()  # the shape groups batches came from
        self.new_shape = False  # the last batch is its group's first: the step compiled for its shape

    def _epoch(self) -> list[tuple[_Group, np.ndarray]]:
        plan = []
        for group in self.train.groups:
            order, size = self.rng.permutation(group.num), min(self.batch_size, group.num)
            plan += [(group, np.sort(order[s:s + size])) for s in range(0, group.num - size + 1, size)]
        if len(self.train.groups) > 1:
            plan = [plan[i] for i in self.rng.permutation(len(plan))]
        return plan[::-1]  # popped from the end

    def next(self) -> tuple[dict, jax.Array | None]:
        if not self.plan:
            self.plan = self._epoch()
        group, idx = self.plan.pop()
        self.new_shape = id(group) not in self.seen
        self.seen.add(id(group))
        batch = self.train.feed(idx, group)
        labels = None if group.labels is None else jnp.asarray(group.labels[idx].astype(np.int32))
        return batch, labels


def _batch_size(config: FinetuneConfig, train: _Data, notes: list[str]) -> int:
    batch_size = min(config.batch_size, train.num)
    if train.fixed_batch and train.fixed_batch != config.batch_size:
        batch_size = train.fixed_batch
        notes.append(f"the model's inputs have a fixed batch size of {batch_size}: using it")
    elif batch_size < config.batch_size:
        notes.append(f"batch size {config.batch_size} is more than the {train.num} samples: using {batch_size}")
    if len(train.groups) > _MANY_SHAPES:
        notes.append(f"the training data has {len(train.groups)} input shapes: each is a compile of the training "
                     "step (and of validation), batches never mix them; pad the samples to a few lengths to "
                     "compile less")
    return batch_size


def _train(run: _Run, rate: float, before: float, train: _Data, batch_size: int, validator: _Validator,
           progress: Callable[[FinetuneProgress], None] | None, notes: list[str]) -> _Trained:
    """The steps from ``start_step`` to ``steps`` at the peak learning rate ``rate``: validation every
    ``validate_every`` steps (about ten times by default; the best values are kept) and progress about fifty
    times. ``before``: the metric of the starting values."""
    config, start_step, steps_run, metric_name = run.config, run.start_step, run.steps_run, validator.metric_name
    params, state, opt_state = dict(run.params0), dict(run.state0), run.opt_state
    hyper = _schedule(rate, config.steps, config.warmup_steps, config.schedule)
    out = _Trained(before, validator.float_metric(), (before, start_step, _host(params), _host(state)), config.steps)
    batches = _Batches(train, batch_size, np.random.default_rng([config.seed, start_step]))
    every = config.validate_every or max(1, steps_run // 10)
    report_every = max(1, steps_run // 50)
    t_loop = time.perf_counter()
    t_after_first, later_compiles, compiling_steps = None, 0.0, 0
    for i in range(steps_run):
        step = start_step + i
        t0 = time.perf_counter()
        params, state, opt_state, loss = _step(run, params, state, opt_state, batches, step, hyper)
        loss = float(loss)
        if batches.new_shape or i == 0:  # the first step of each input shape compiles the step for it
            took = time.perf_counter() - t0
            out.compile_seconds += took
            compiling_steps += 1
            later_compiles += took if i else 0.0
        if i == 0:
            t_after_first = time.perf_counter()
            out.loss_first = loss
        out.loss_last = loss
        if not math.isfinite(loss):
            skipped = int(opt_state.total_notfinite)
            why = f" after {skipped} step(s) whose gradients were not finite (skipped)" if skipped else ""
            raise QtoolError(f"the loss became {loss} at step {step}{why}: lower the learning rate (now {rate:g})")
        done = i + 1
        elapsed = time.perf_counter() - t_loop
        eta = None
        if done > compiling_steps:
            eta = _per_step(t_after_first, later_compiles, done - compiling_steps) * (steps_run - done)
        validate = done % every == 0 or done == steps_run
        m = validator.metric(params, state) if validate else None
        if validate:
            out.history.append({"step": step + 1, "loss": loss, metric_name: m})
            if m > out.best[0] or not config.keep_best:
                out.best = (m, step + 1, _host(params), _host(state))
        if progress is not None and (validate or done % report_every == 0 or done == 1):
            progress(FinetuneProgress(step + 1, config.steps, loss, elapsed, eta, metric_name if validate else None, m))
    loop_seconds = time.perf_counter() - t_loop
    skipped = int(opt_state.total_notfinite)
    if skipped:
        notes.append(f"{skipped} step(s) were skipped: their gradients were not finite (no update applied)")
    _note_kept_best(out, config, metric_name, notes)
    out.seconds_per_step = (_per_step(t_after_first, later_compiles, steps_run - compiling_steps)
                            if steps_run > compiling_steps else loop_seconds)
    return out


def _per_step(t_after_first: float, later_compiles: float, steps: int) -> float:
    """Seconds a step takes (its share of validation included) since the first step, less the compiles of the
    other input shapes' first steps."""
    return (time.perf_counter() - t_after_first - later_compiles) / steps


def _step(run: _Run, params, state, opt_state, batches: _Batches, step: int, hyper):
    """One training step on the next batch: the new params, state, optimizer state and the loss."""
    batch, labels = batches.next()
    return run.train_step(params, state, opt_state, run.teacher_feed, batch, labels, jnp.int32(step), hyper)


def _untrained(run: _Run, validator: _Validator, before: float) -> _Trained:
    """No steps: the starting values are the result (the schedule stays where it was)."""
    return _Trained(before, validator.float_metric(), (before, run.start_step, _host(run.params0), _host(run.state0)),
                    run.start_step)


def _probe_rates(run: _Run, train: _Data, batch_size: int, validator: _Validator, before: float,
                 progress: Callable[[FinetuneProgress], None] | None,
                 notes: list[str]) -> tuple[float | None, list, float]:
    """``learning_rate="auto"``: from the starting values, a short run of the configured schedule (cosine decays to
    0 at its end, warm-up scaled) at each rate of ``LEARNING_RATE_CANDIDATES``, on the batches the run will see
    first; each is validated at its end. The rate with the best metric is chosen if it beats the start (ties
    choose the smaller rate), else none (every rate made the model worse). Same compiled step: the rate is an
    argument. Returns the rate, the probes' results and the seconds of the first step (the compile)."""
    config, metric_name = run.config, validator.metric_name
    length = config.probe_length(run.start_step)
    warmup = round(config.warmup_steps * length / max(1, config.steps - run.start_step))
    probes, best, compile_seconds = [], (before, None), None
    for rate in LEARNING_RATE_CANDIDATES:
        params, state, opt_state = (jax.tree.map(jnp.copy, t) for t in (run.params0, run.state0, run.opt_state))
        hyper = _schedule(rate, length, warmup, config.schedule, origin=run.start_step)
        batches = _Batches(train, batch_size, np.random.default_rng([config.seed, run.start_step]))
        for i in range(length):
            t0 = time.perf_counter()
            params, state, opt_state, loss = _step(run, params, state, opt_state, batches, run.start_step + i, hyper)
            if compile_seconds is None:
                jax.block_until_ready(loss)
                compile_seconds = time.perf_counter() - t0
        loss = float(loss)
        m = validator.metric(params, state) if math.isfinite(loss) else -math.inf
        probes.append({"learning_rate": rate, "loss": loss, metric_name: m})
        if m > best[0]:
            best = (m, rate)
        if progress is not None:
            progress(FinetuneProgress(length, config.steps, loss, 0.0, None, metric_name, m, probe=rate))
    tried = ", ".join(f"{p['learning_rate']:g}: {_fmt_metric(metric_name, p[metric_name])}" for p in probes)
    if best[1] is None:
        notes.append(f"learning rate auto: every probed rate ({length} steps each) made the validation "
                     f"{metric_name} worse than the start's {_fmt_metric(metric_name, before)} ({tried}): "
                     "the input's values are kept, no steps run")
    else:
        notes.append(f"learning rate auto: {best[1]:g} ({length}-step probes from "
                     f"{_fmt_metric(metric_name, before)}: {tried})")
    return best[1], probes, compile_seconds


def _note_kept_best(trained: _Trained, config: FinetuneConfig, metric_name: str, notes: list[str]) -> None:
    last = trained.history[-1][metric_name] if trained.history else trained.before
    if config.keep_best and trained.best_step != config.steps:
        than = "better than" if trained.after > last else "the first as good as"  # ties keep the earlier step
        notes.append(f"kept the values of step {trained.best_step} "
                     f"({metric_name} {_fmt_metric(metric_name, trained.after)}), "
                     f"{than} the last step's ({_fmt_metric(metric_name, last)})")


# --- write back -------------------------------------------------------------------------------------------------------
def _save_tuned(ir_model, output: str, config: FinetuneConfig, trained: _Trained, metric_name: str,
                range_update: str | None, rate: float | None, probes: list) -> None:
    """The kept values into the graph, the run recorded in its ``qtool.finetune`` metadata; saved atomically.
    The range-update input's default becomes 0: the tuned graph run as is holds its trained ranges and
    computes what ``rewrite-eval`` deploys (``finetune`` itself feeds 1 while it trains)."""
    _, best_step, best_params, best_state = trained.best
    held = {} if range_update is None else {range_update: np.float32(0.0)}
    _write_back(ir_model, {**best_params, **best_state, **held}, {
        "version": 1,
        "step": trained.end_step,
        "best_step": best_step,
        "schedule": {"steps": config.steps, "learning_rate": rate, "schedule": config.schedule,
                     "warmup_steps": config.warmup_steps},
        **({"learning_rate_probe": probes} if probes else {}),
        "seed": config.seed,
        "labels": config.labels,
        "distillation": config.distillation,
        "metric": {"name": metric_name, "before": trained.before, "after": trained.after,
                   "float": trained.float_metric},
    })
    save_model(ir_model, output)


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
