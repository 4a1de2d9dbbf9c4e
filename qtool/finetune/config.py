"""``qtool finetune``'s options, progress and result: plain data, no JAX (the CLI builds them)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from qtool.errors import QtoolError

FINETUNE_METADATA_KEY = "qtool.finetune"
DISTILLATION = ("mse", "kl")
SCHEDULES = ("cosine", "constant")
AUTO = "auto"
LEARNING_RATE_CANDIDATES = (1e-6, 1e-5, 1e-4, 1e-3)  # what learning_rate="auto" probes


# --- options and results -------------------------------------------------------------------------
@dataclass(frozen=True)
class FinetuneConfig:
    """What ``finetune`` does. ``steps`` is the length of the schedule: a resumed run goes on
    from the step recorded in the file to ``steps``."""

    steps: int = 300
    batch_size: int = 32
    learning_rate: float | str = 1e-4  # Adam's peak rate, or "auto": probe LEARNING_RATE_CANDIDATES first
    probe_steps: int = 0  # with "auto": steps of each probe (0: a quarter of the schedule, 5 to 25)
    schedule: str = "cosine"  # cosine decay to 0 over `steps`, or constant
    warmup_steps: int = 0
    labels: str | None = None  # array of the data (and validation) npz with class ids: adds cross-entropy
    validation_labels: str | None = None  # class ids in the validation data (default: `labels`): accuracy
    distillation: str = "mse"  # normalized MSE on every output, or KL on the first output (logits)
    distillation_weight: float = 1.0  # with labels: weight of the distillation term (0: labels only)
    temperature: float = 1.0  # KL distillation temperature
    train_ranges: bool = True  # activation min/max trained by the optimizer (on top of their EMA)
    keep_best: bool = True  # write the values of the best validation (the input's, if nothing beat it)
    validation_data: object = None  # a path, or a mapping of arrays; None: the training data
    validate_every: int = 0  # steps between validations (0: about ten times per run)
    seed: int = 0
    resume: bool = False  # continue from the step recorded in the input's qtool.finetune metadata

    def normalized(self) -> FinetuneConfig:
        def positive_int(v, name, minimum=1):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
                raise QtoolError(f"{name} must be an integer >= {minimum}, got {v!r}")
            return int(v)

        def number(v, name, minimum=0.0, strict=False):
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise QtoolError(f"{name} must be a number, got {v!r}") from None
            if not math.isfinite(f) or f < minimum or (strict and f == minimum):
                raise QtoolError(f"{name} must be a finite number {'>' if strict else '>='} {minimum}, got {v!r}")
            return f

        if self.schedule not in SCHEDULES:
            raise QtoolError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.distillation not in DISTILLATION:
            raise QtoolError(f"distillation must be one of {', '.join(DISTILLATION)}, got {self.distillation!r}")
        distill_weight = number(self.distillation_weight, "distillation weight")
        if distill_weight == 0 and self.labels is None:
            raise QtoolError("a distillation weight of 0 needs --labels (there would be no loss)")
        return FinetuneConfig(
            steps=positive_int(self.steps, "steps"),
            batch_size=positive_int(self.batch_size, "batch size"),
            learning_rate=(AUTO if isinstance(self.learning_rate, str) and self.learning_rate.lower() == AUTO
                           else number(self.learning_rate, "learning rate (or 'auto')", strict=True)),
            probe_steps=positive_int(self.probe_steps, "probe steps", 0),
            schedule=self.schedule,
            warmup_steps=positive_int(self.warmup_steps, "warmup steps", 0),
            labels=self.labels,
            validation_labels=self.validation_labels,
            distillation=self.distillation,
            distillation_weight=distill_weight,
            temperature=number(self.temperature, "temperature", strict=True),
            train_ranges=bool(self.train_ranges),
            keep_best=bool(self.keep_best),
            validation_data=self.validation_data,
            validate_every=positive_int(self.validate_every, "validate every", 0),
            seed=positive_int(self.seed, "seed", 0),
            resume=bool(self.resume),
        )

    def probe_length(self, start_step: int = 0) -> int:
        """Steps of each learning-rate probe: ``probe_steps``, or a quarter of the steps to run (5 to 25)."""
        return self.probe_steps or min(25, max(5, (self.steps - start_step) // 4))

    def to_dict(self) -> dict:
        d = asdict(self)
        v = d["validation_data"]
        d["validation_data"] = v if v is None or isinstance(v, str) else f"<{type(v).__name__}>"
        return d


@dataclass(frozen=True)
class FinetuneProgress:
    """What the progress callback receives (after a step or a validation)."""

    step: int  # the global step just done (qtool_step + 1)
    steps: int  # the end of the schedule
    loss: float
    elapsed_seconds: float
    eta_seconds: float | None
    metric_name: str | None = None
    metric: float | None = None  # set on validation events
    probe: float | None = None  # a learning-rate probe's rate: the event is its result (step: its length)

    def format_text(self) -> str:
        if self.probe is not None:
            return (f"probe learning rate {self.probe:g} ({self.step} steps)  loss {self.loss:.5g}  "
                    f"validation {self.metric_name} {_fmt_metric(self.metric_name, self.metric)}")
        eta = "" if self.eta_seconds is None else f"  eta {_fmt_seconds(self.eta_seconds)}"
        line = f"step {self.step}/{self.steps}  loss {self.loss:.5g}{eta}"
        if self.metric is not None:
            line += f"  validation {self.metric_name} {_fmt_metric(self.metric_name, self.metric)}"
        return line


@dataclass
class FinetuneResult:
    input: str
    output: str | None
    metric_name: str  # accuracy | sqnr_db
    metric_source: str  # which data the metric is on
    before: float  # quantized model (eval mode) before training
    after: float  # ... after
    float_metric: float  # the teacher (float model)
    start_step: int
    end_step: int
    steps_run: int
    seconds: float
    compile_seconds: float
    seconds_per_step: float
    peak_rss_mb: float
    loss_first: float | None
    loss_last: float | None
    best_step: int  # the step whose values were written (keep_best)
    parameters: int  # trainable tensors
    parameter_values: int  # their element count
    learning_rate: float | None = None  # the peak rate trained with (None: "auto" found none better than no change)
    learning_rate_probe: list = field(default_factory=list)  # with "auto": {"learning_rate", "loss", metric} each
    config: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # validations: {"step", "loss", metric}
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def format_text(self) -> str:
        m = self.metric_name
        lines = [
            f"qtool finetune: {self.input} -> {self.output or '(not written)'}",
            f"  steps                  {self.start_step} -> {self.end_step} ({self.steps_run} run, "
            f"{self.seconds_per_step * 1000:.1f} ms/step, compile {self.compile_seconds:.1f} s)",
            f"  loss                   {_fmt_opt(self.loss_first)} -> {_fmt_opt(self.loss_last)}",
            f"  {m + ' (' + self.metric_source + ')':<22} quantized {_fmt_metric(m, self.before)} -> "
            f"{_fmt_metric(m, self.after)}   float {_fmt_metric(m, self.float_metric)}",
            f"  learning rate          {self._format_rate()}",
            f"  time                   {_fmt_seconds(self.seconds)}, peak memory {self.peak_rss_mb:.0f} MB",
            f"  trained                {self.parameters} tensors, {self.parameter_values} values",
        ]
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def _format_rate(self) -> str:
        chosen = "none (no change)" if self.learning_rate is None else f"{self.learning_rate:g}"
        if not self.learning_rate_probe:
            return chosen
        m = self.metric_name
        probed = ", ".join(f"{p['learning_rate']:g} {_fmt_metric(m, p[m])}" for p in self.learning_rate_probe)
        return f"auto: {chosen} (start {_fmt_metric(m, self.before)}; probed {probed})"


def _fmt_opt(v) -> str:
    return "-" if v is None else f"{v:.5g}"


def _fmt_metric(name, v) -> str:
    if v is None:
        return "-"
    if name == "accuracy":
        return f"{100 * v:.2f}%"
    return f"{v:.2f} dB"


def _fmt_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min"
