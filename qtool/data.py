"""Calibration data: read, check against the model's inputs, cut into batches.

The file is an ``.npz`` with one array per model input, samples on the first
axis; a model with one input may also take a plain ``.npy`` or an ``.npz``
holding a single array under any name. Arrays named like no input are
ignored (an evaluation file with ``labels`` works), and reported.

Every mismatch is a :class:`~qtool.errors.QtoolError` that names the input
and says what was expected: missing arrays, wrong dtype, wrong rank, a static
dimension that differs, inputs with different sample counts, a fixed batch
size that the sample count is not a multiple of.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype | None
    shape: tuple | None  # ints for static dims, str/None for dynamic ones

    def describe_shape(self) -> str:
        if self.shape is None:
            return "any shape"
        dims = [str(d) if isinstance(d, int) else (d if d else "?") for d in self.shape]
        return "[" + ", ".join(dims) + "]"


def input_specs(model) -> list[InputSpec]:
    """The inputs the caller must feed (graph inputs that are not initializers)."""
    specs = []
    for value in model.graph.inputs:
        if value.is_initializer():
            continue
        dtype = None
        if value.dtype is not None:
            try:
                dtype = np.dtype(value.dtype.numpy())
            except Exception:  # noqa: BLE001 - types numpy cannot hold
                dtype = None
        shape = None
        if value.shape is not None:
            shape = tuple(d if isinstance(d, int) else (d.value if hasattr(d, "value") else None) for d in value.shape)
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


@dataclass
class CalibrationData:
    arrays: dict[str, np.ndarray]
    num_samples: int
    fixed_batch: int | None = None  # the model's static batch size, if it has one
    ignored: list[str] = field(default_factory=list)
    source: str | None = None

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        size = self.fixed_batch or batch_size
        for start in range(0, self.num_samples, size):
            yield {name: arr[start : start + size] for name, arr in self.arrays.items()}

    def num_batches(self, batch_size: int) -> int:
        size = self.fixed_batch or batch_size
        return -(-self.num_samples // size)


def _read(path: str) -> dict[str, np.ndarray]:
    if not os.path.exists(path):
        raise QtoolError(f"calibration data file '{path}' does not exist")
    if os.path.isdir(path):
        raise QtoolError(f"calibration data path '{path}' is a folder, not a file")
    try:
        if zipfile.is_zipfile(path):
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        array = np.load(path, allow_pickle=False, mmap_mode="r")
    except QtoolError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds on bad files
        raise QtoolError(f"cannot read calibration data '{path}': not a valid .npz or .npy file ({exc})") from exc
    if not isinstance(array, np.ndarray):
        raise QtoolError(f"cannot read calibration data '{path}': not a .npz or .npy file")
    return {"": array}


def load_calibration_data(source, specs: list[InputSpec]) -> CalibrationData:
    """Read ``source`` (a path, an array, or a mapping of arrays) and check it against ``specs``."""
    label = None
    if isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        arrays = _read(label)
    elif isinstance(source, np.ndarray):
        arrays = {"": source}
    elif isinstance(source, Mapping):
        arrays = {str(k): np.asarray(v) for k, v in source.items()}
    else:
        raise QtoolError(f"calibration data must be a file path, an array or a dict of arrays, got {type(source).__name__}")
    where = f" in '{label}'" if label else ""
    if not specs:
        raise QtoolError("the model has no inputs to feed calibration data to")
    names = [s.name for s in specs]
    chosen: dict[str, np.ndarray] = {}
    ignored: list[str] = []
    if len(specs) == 1 and (list(arrays) == [""] or (len(arrays) == 1 and names[0] not in arrays)):
        chosen[names[0]] = next(iter(arrays.values()))
    else:
        if "" in arrays:
            raise QtoolError(
                f"a single array{where} cannot feed a model with {len(specs)} inputs "
                f"({', '.join(names)}): use an .npz with one array per input"
            )
        missing = [n for n in names if n not in arrays]
        if missing:
            have = ", ".join(repr(k) for k in arrays) or "none"
            raise QtoolError(
                f"calibration data{where} has no array for model input {missing[0]!r} "
                f"(model inputs: {', '.join(repr(n) for n in names)}; arrays: {have})"
            )
        for name in names:
            chosen[name] = arrays[name]
        ignored = [k for k in arrays if k not in names]

    counts = {}
    fixed_batch = None
    for spec in specs:
        arr = chosen[spec.name]
        if spec.dtype is not None and arr.dtype != spec.dtype:
            raise QtoolError(
                f"calibration data for input '{spec.name}': expected dtype {spec.dtype}, got {arr.dtype}"
                + (f" (convert it with .astype(np.{spec.dtype}))" if arr.dtype.kind in "fiub" else "")
            )
        if arr.ndim == 0:
            raise QtoolError(f"calibration data for input '{spec.name}' is a scalar; samples go on the first axis")
        if spec.shape is not None:
            if arr.ndim != len(spec.shape):
                raise QtoolError(
                    f"calibration data for input '{spec.name}': expected {len(spec.shape)} dimensions "
                    f"{spec.describe_shape()} (samples first), got shape {list(arr.shape)}"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, arr.shape)):
                if axis == 0:
                    if isinstance(want, int) and want > 0:
                        fixed_batch = want if fixed_batch is None else fixed_batch
                    continue
                if isinstance(want, int) and want > 0 and want != got:
                    raise QtoolError(
                        f"calibration data for input '{spec.name}': expected shape {spec.describe_shape()}, "
                        f"got {list(arr.shape)} (dimension {axis} is {got}, the model needs {want})"
                    )
        counts[spec.name] = arr.shape[0]
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"'{k}': {v}" for k, v in counts.items())
        raise QtoolError(f"calibration arrays have different numbers of samples ({detail})")
    num = next(iter(counts.values()))
    if num == 0:
        raise QtoolError(f"calibration data{where} has no samples")
    if fixed_batch is not None and num % fixed_batch:
        raise QtoolError(
            f"the model's inputs have a fixed batch size of {fixed_batch}, but the calibration data has "
            f"{num} samples: give a multiple of {fixed_batch}"
        )
    return CalibrationData(chosen, num, fixed_batch, ignored, label)
