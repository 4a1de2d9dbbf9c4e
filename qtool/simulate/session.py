"""simulate's runs: a model as a user runs it, and a copy that also returns tensors (sessions: qtool.model.session).

No model is serialized whole: a session is created from the model's file
when there is one, and otherwise from a proto whose weights are placeholders
(``light_proto``), onnxruntime getting the tensors as OrtValues over the
arrays qtool already holds (memory-mapped for external data). So models with
external data work from any folder, and models over 2 GB work at all.

Exactness: the tensors are read from a copy with extra graph outputs, which
can change what onnxruntime fuses. The first batch also runs the unmodified
model and compares its output bit for bit; if they differ, the unmodified
model runs beside the copy on every batch and the model numbers come from it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qtool.model.runtime_graph import LayerKernels, layer_kernels, saving_optimized_graph, worth_looking
from qtool.model.session import TappedSession, file_session, session_options, tapped_session


def _options() -> ort.SessionOptions:
    """All optimizations, as a user gets them; the batch-after-batch memory settings of calibration."""
    options = session_options()
    # Several sessions take turns on every batch: idle ones must not spin on the
    # cores the running one needs (scheduling only; the numbers do not change).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # nor hold memory between their turns: an arena keeps the high-water mark of its session's runs (a
    # batch's tapped tensors), one per session at once (ViT-B/16 with two what-if models: 6.3 -> 5.8 GB)
    options.enable_cpu_mem_arena = False
    return options


def _run(session: TappedSession, names: list[str], feed: dict, what: str) -> list[np.ndarray]:
    """The named outputs, read in place: together they keep onnxruntime's output vector alive until the
    last is dropped (the batch's comparison holds them all anyway), where a copy of each, made while
    the vector was alive, doubled the peak (ViT-B/16, 16 samples: 3 GB of tensors per model)."""
    return [value.numpy() for value in session.run(feed, names, what)]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@dataclass
class Runner:
    """One model run on every batch: its compared output plus the tensors read from it.

    ``model``: the IR model; ``path``: its file when it has one (the plain
    session is opened from it, as a user opens it). ``extra``: values of
    ``model`` to read beside the output.
    """

    label: str
    output: str
    model: ir.Model
    path: str | None = None
    extra: list[ir.Value] = field(default_factory=list)
    dtypes: dict = field(default_factory=dict)
    instrumented: TappedSession | None = None
    plain: TappedSession | None = None
    plain_every_batch: bool = False
    checked: bool = False
    runtime_layers: LayerKernels | None = None  # from :meth:`open` with ``runtime_graph``

    @property
    def what(self) -> str:
        return f"the model '{self.label}'"

    def open(self, runtime_graph: bool = False) -> None:
        """Make the sessions. ``runtime_graph``: also read which layers onnxruntime's optimized graph runs in
        integer and in float kernels (:attr:`runtime_layers`; :mod:`qtool.model.runtime_graph`)."""
        options = _options()
        looking = runtime_graph and worth_looking(self.model)
        with saving_optimized_graph(options) if looking else contextlib.nullcontext() as graph:
            plain = file_session(self.path, options=options, what=self.what) if self.path else \
                tapped_session(self.model, [], options=options, what=self.what)
            self.runtime_layers = layer_kernels(graph) if graph is not None else None
        if not self.extra:
            self.instrumented = plain
            self.checked = True
            return
        self.instrumented = tapped_session(self.model, self.extra, options=_options(),
                                           what=f"{self.what} (with extra outputs)", dtypes=self.dtypes)
        self.plain = plain

    @property
    def extra_names(self) -> list[str]:
        return [v.name for v in self.extra if v.name != self.output]

    def run(self, feed: dict, batch: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        names = [self.output] + self.extra_names
        what = f"{self.what}, batch {batch}"
        outs = _run(self.instrumented, names, feed, what)
        out, extra = outs[0], dict(zip(names[1:], outs[1:]))
        if not self.checked or self.plain_every_batch:
            plain = _run(self.plain, [self.output], feed, what)[0]
            if not self.checked:
                self.checked = True
                self.plain_every_batch = not _same(plain, out)
                if not self.plain_every_batch:
                    self.plain = None
            out = plain
        return out, extra

    def close(self) -> None:
        self.instrumented = None
        self.plain = None
