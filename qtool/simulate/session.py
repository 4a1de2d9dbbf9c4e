"""onnxruntime sessions for simulate: a model as a user runs it, and a copy that also returns tensors.

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

import os
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from qtool.errors import QtoolError
from qtool.model.io import light_proto
from qtool.model.session import NUMPY_TYPES, contiguous



def _options() -> ort.SessionOptions:
    """Default options (all optimizations, as a user gets them), CPU."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # Several sessions take turns on every batch: idle ones must not spin on the
    # cores the running one needs (scheduling only; the numbers do not change).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _create(source, options, what: str):
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        raise QtoolError(f"onnxruntime cannot run {what}: {str(exc).strip().splitlines()[0]}") from exc


@dataclass
class OpenSession:
    """An onnxruntime session and the arrays it reads (which must outlive it)."""

    session: object
    keepalive: tuple = ()

    def run(self, names: list[str], feed: dict, what: str, batch: int) -> list[np.ndarray]:
        try:
            return self.session.run(names, feed)
        except Exception as exc:  # noqa: BLE001
            raise QtoolError(f"onnxruntime failed on {what}, batch {batch}: {str(exc).strip().splitlines()[0]}") from exc


def open_model(model: ir.Model, what: str, extra: list[ir.Value] = (), dtypes: dict | None = None) -> OpenSession:
    """A session of ``model`` (an in-memory IR model) returning ``extra`` values as outputs too.

    ``dtypes``: element types of extra values the model does not type
    (default float). The model is left as it was (the extra outputs are added
    for the proto and removed).
    """
    graph = model.graph
    added = [v for v in extra if not v.is_graph_output()]
    typed = [v for v in added if v.type is None]
    for v in typed:
        v.type = ir.TensorType(v.dtype or (dtypes or {}).get(v.name) or ir.DataType.FLOAT)
    count = len(graph.outputs)
    graph.outputs.extend(added)
    try:
        proto, saved = light_proto(model, movable=lambda t: t.dtype in NUMPY_TYPES)
    finally:
        while len(graph.outputs) > count:
            graph.outputs.pop()
        for v in typed:
            v.type = None
    options = _options()
    # onnxruntime drops initializers no node reads before it takes these: give it only the used ones
    used = {name for name, v in graph.initializers.items() if v.uses() or v.is_graph_output()}
    names = [name for name in saved if name in used]
    arrays = [contiguous(saved[name].numpy()) for name in names]
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    if names:
        options.add_external_initializers(names, values)
    return OpenSession(_create(proto.SerializeToString(), options, what), (arrays, values))


def open_file(path: str, what: str) -> OpenSession:
    """A session of the model file itself: what a user gets (external data next to the file)."""
    return OpenSession(_create(os.fspath(path), _options(), what))


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
    instrumented: OpenSession | None = None
    plain: OpenSession | None = None
    plain_every_batch: bool = False
    checked: bool = False

    @property
    def what(self) -> str:
        return f"the model '{self.label}'"

    def open(self) -> None:
        plain = open_file(self.path, self.what) if self.path else None
        if not self.extra:
            self.instrumented = plain or open_model(self.model, self.what)
            self.checked = True
            return
        self.instrumented = open_model(self.model, f"{self.what} (with extra outputs)", self.extra, self.dtypes)
        self.plain = plain or open_model(self.model, self.what)

    @property
    def extra_names(self) -> list[str]:
        return [v.name for v in self.extra if v.name != self.output]

    def run(self, feed: dict, batch: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        names = [self.output] + self.extra_names
        outs = self.instrumented.run(names, feed, self.what, batch)
        out, extra = outs[0], dict(zip(names[1:], outs[1:]))
        if not self.checked or self.plain_every_batch:
            plain = self.plain.run([self.output], feed, self.what, batch)[0]
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
