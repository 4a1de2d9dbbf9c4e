"""Reading and writing model files.

- ``load_model`` turns every way a model file can be wrong (missing, a folder,
  unreadable, not ONNX, truncated, external data missing) into a
  :class:`~qtool.errors.QtoolError` with one clear line.
- ``save_model`` never leaves a partial output: it writes into a temporary
  folder next to the target and renames at the end (external data first, then
  the ``.onnx`` file). On any failure the temporary folder is removed and the
  target is untouched.
- Models whose tensors add up to more than ``EXTERNAL_DATA_THRESHOLD`` bytes
  (protobuf cannot hold 2 GB), or that were read with external data, are
  written with external data in ``<output name>.data``.
- The IR version written is at most ``MAX_IR_VERSION`` (what the onnxruntime
  in the dependencies reads).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from qtool.errors import QtoolError
from qtool.model import validate

# onnxruntime 1.31 loads IR version <= 13 (onnx 1.23 writes 14 by default).
MAX_IR_VERSION = 13
# Protobuf's hard limit is 2 GiB for the whole message; stay clear of it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


@dataclass
class LoadedModel:
    model: ir.Model
    path: str
    external_data: bool  # the file referenced tensors in external files


def _check_readable(path: str, what: str = "model") -> None:
    if not os.path.exists(path):
        raise QtoolError(f"{what} file '{path}' does not exist")
    if os.path.isdir(path):
        raise QtoolError(f"{what} path '{path}' is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise QtoolError(f"cannot read {what} file '{path}': permission denied")


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load an ONNX file into the IR, with clear errors for every bad file."""
    path = os.fspath(path)
    _check_readable(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise QtoolError(f"cannot read model file '{path}': {exc.strerror or exc}") from exc
    if not data:
        raise QtoolError(f"'{path}' is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise QtoolError(f"'{path}' is not an ONNX model or is truncated ({exc})") from exc
    del data
    if not proto.HasField("graph") or proto.ir_version <= 0 or not proto.opset_import:
        raise QtoolError(f"'{path}' is not an ONNX model (no graph, IR version or opset)")
    model = model_from_proto(proto, path, base_dir=os.path.dirname(os.path.abspath(path)))
    external = _check_external_data(model, path)
    _check_graph_closed(model.graph, path)
    validate.run_checker(light_proto(model)[0], path)
    validate.check_finite_parameters(model.graph, path)
    return LoadedModel(model, path, external)


def model_from_proto(proto: onnx.ModelProto, label: str, base_dir: str | None = None) -> ir.Model:
    """The IR of a parsed model, after the checks of :mod:`qtool.model.validate` on the proto
    (sparse initializers densified: in place, so pass a copy of a proto that is not yours)."""
    validate.check_proto(proto, label)
    validate.densify_sparse(proto, label)
    logger = logging.getLogger("onnx_ir")
    level = logger.level
    logger.setLevel(logging.ERROR)  # undefined inputs are reported below, as one line
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:  # noqa: BLE001 - any failure here means a malformed file
        raise QtoolError(f"'{label}' is not a valid ONNX model: {_one_line(exc)}") from exc
    finally:
        logger.setLevel(level)
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    validate.sort_graphs(model)
    _external_constants_to_initializers(model.graph)
    return model


def _external_constants_to_initializers(graph: ir.Graph) -> int:
    """``Constant`` nodes whose value is in external data become initializers of the same name.

    Every tool that hands a model to onnxruntime or to the onnx converters replaces
    external initializers, never external node attributes, by the arrays; this keeps
    the weights in their file (no copy) and makes such exports (``convert_attribute=True``)
    work like the usual ones.
    """
    moved = 0
    for node in list(graph):
        if node.op_type != "Constant" or node.domain != "" or len(node.outputs) != 1:
            continue
        attr = node.attributes.get("value")
        if attr is None or attr.type != ir.AttributeType.TENSOR or not isinstance(attr.as_tensor(), ir.ExternalTensor):
            continue
        old = node.outputs[0]
        name = old.name
        if not name or name in graph.initializers:
            continue
        value = ir.Value(name=None, shape=old.shape, type=old.type, const_value=attr.as_tensor())
        old.replace_all_uses_with(value, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        old.name = None
        value.name = name
        graph.register_initializer(value)
        moved += 1
    return moved


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line; onnx-ir's wrapped errors are reduced to their cause."""
    while exc.__cause__ is not None and type(exc).__name__ == "SerdeError":
        exc = exc.__cause__
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def external_tensors(model: ir.Model):
    """(name, tensor) of every tensor of ``model`` kept in external data: initializers and tensor
    attributes (``Constant`` nodes), in every graph."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.name, value.const_value
    for node in model.graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR:
                tensors = [attr.as_tensor()]
            elif attr.type == ir.AttributeType.TENSORS:
                tensors = list(attr.as_tensors())
            else:
                continue
            for tensor in tensors:
                if isinstance(tensor, ir.ExternalTensor):
                    output = node.outputs[0].name if node.outputs else None
                    yield tensor.name or output or f"{attr.name} of a {node.op_type} node", tensor


def _check_external_data(model: ir.Model, path: str) -> bool:
    external = False
    for name, tensor in external_tensors(model):
        external = True
        data_path = tensor.path
        if not os.path.isfile(data_path):
            raise QtoolError(
                f"external data file '{tensor.location}' of tensor '{name}' "
                f"(referenced by '{path}') does not exist"
            )
        length = tensor.length if tensor.length is not None else tensor.nbytes
        end = (tensor.offset or 0) + length
        if os.path.getsize(data_path) < end:
            raise QtoolError(
                f"external data file '{tensor.location}' is truncated: tensor '{name}' "
                f"needs bytes up to {end}, the file has {os.path.getsize(data_path)}"
            )
    return external


def _check_graph_closed(graph: ir.Graph, path: str) -> None:
    """Every value a node reads must be defined: catches files cut at a field boundary."""
    for node in graph:
        for value in node.inputs:
            if value is None:
                continue
            if value.producer() is None and not value.is_graph_input() and not value.is_initializer():
                if value.graph is None and value.const_value is None:
                    raise QtoolError(
                        f"'{path}' is invalid or truncated: tensor '{value.name}' read by node "
                        f"'{node.name or node.op_type}' is not defined"
                    )
    if not graph.outputs:
        raise QtoolError(f"'{path}' is invalid or truncated: the graph has no outputs")


# --- saving -----------------------------------------------------------------------
def tensor_bytes(model: ir.Model) -> int:
    """Bytes of all initializers and Constant-node tensors (what protobuf would hold)."""
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    for node in model.graph.all_nodes():
        if node.op_type == "Constant" and node.domain == "":
            attr = node.attributes.get("value")
            if attr is not None and attr.type == ir.AttributeType.TENSOR:
                total += attr.as_tensor().nbytes
    return total


def check_output_path(output: str | os.PathLike) -> str:
    """The absolute output path, after checking that its folder exists and is writable."""
    output = os.fspath(output)
    folder = os.path.dirname(os.path.abspath(output)) or "."
    if not os.path.isdir(folder):
        raise QtoolError(f"output folder '{os.path.dirname(output) or folder}' does not exist")
    if os.path.isdir(output):
        raise QtoolError(f"output path '{output}' is a folder, not a file")
    _check_writable(folder)
    return os.path.abspath(output)


def _check_writable(folder: str) -> None:
    """Create and remove a probe file: ``os.access`` says yes to root on any folder."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".qtool-probe-", dir=folder)
    except OSError as exc:
        raise QtoolError(f"cannot write to output folder '{folder}': {exc.strerror or exc}") from exc
    os.close(fd)
    os.unlink(probe)


def clamp_ir_version(model: ir.Model) -> None:
    """IR version: at least what the opsets need, at most what onnxruntime reads."""
    opsets = [onnx.helper.make_opsetid(domain, version) for domain, version in model.opset_imports.items()]
    try:
        needed = onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    except Exception:  # noqa: BLE001 - unknown domains
        needed = 7
    model.ir_version = min(max(model.ir_version, needed), MAX_IR_VERSION)


def save_model(model: ir.Model, output: str | os.PathLike, *, external_data: bool = False) -> str | None:
    """Write ``model`` to ``output`` atomically. Returns the external data file name, if any.

    ``external_data`` forces external data; it is also used when the tensors
    exceed :data:`EXTERNAL_DATA_THRESHOLD`.

    The rename of the ``.onnx`` file is the one commit point. Everything is
    written in a temporary folder ``.qtool-tmp-<pid>-*`` next to the target and
    flushed to disk; external data goes to a file of a new name
    (``<output>.qt-<token>.data``) moved next to the target before the commit,
    so the data file the target names is never written to in place. After the
    commit, the data file the previous target named is removed if qtool wrote
    it. A kill at any moment leaves the complete old target or the complete
    new one (plus, at worst, temporaries that the next save in the folder
    removes: :func:`clean_stale`).
    """
    output = check_output_path(output)
    _drop_initializer_value_info(model)
    folder = os.path.dirname(output)
    name = os.path.basename(output)
    clean_stale(folder)
    use_external = external_data or tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    try:
        tmpdir = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=folder)
    except OSError as exc:
        raise QtoolError(f"cannot write to output folder '{folder}': {exc.strerror or exc}") from exc
    data_name = None
    committed = False
    try:
        tmp_model = os.path.join(tmpdir, name)
        if use_external:
            data_name = f"{name}.{DATA_TOKEN_PREFIX}{secrets.token_hex(6)}.data"
            ir.save(model, tmp_model, external_data=data_name, size_threshold_bytes=1024)
            _fsync(os.path.join(tmpdir, data_name))
        else:
            proto = ir.serde.serialize_model(model)
            with open(tmp_model, "wb") as f:
                f.write(proto.SerializeToString())
        _fsync(tmp_model)
        _step("written")
        previous = _referenced_data(output) if os.path.lexists(output) else set()
        if data_name is not None:
            # a new name: no reader of the current target ever sees this file change
            os.replace(os.path.join(tmpdir, data_name), os.path.join(folder, data_name))
            _fsync(folder)
            _step("data moved")
        os.replace(tmp_model, output)  # the commit
        committed = True
        _fsync(folder)
        _step("committed")
        for old in previous or ():
            if old != data_name and _ours(name, old):
                _remove(os.path.join(folder, old))
        return data_name
    except ValueError as exc:
        if "2GB" in str(exc) or "exceeds maximum protobuf size" in str(exc):
            raise QtoolError(f"cannot write '{output}': model too large for one file ({exc})") from exc
        raise
    except OSError as exc:
        raise QtoolError(f"cannot write '{output}': {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if data_name is not None and not committed:
            _remove(os.path.join(folder, data_name))


def _step(name: str) -> None:
    """A point between the steps of :func:`save_model` (tests inject failures and kills here)."""


# --- temporaries and stale files ------------------------------------------------------------
TMP_PREFIX = ".qtool-tmp-"  # + "<pid>-<random>": save_model's temporary folders
RANGES_TMP_PREFIX = ".qtool-ranges-"  # + "<pid>-<random>.tmp": the ranges file writer's temporary files
DATA_TOKEN_PREFIX = "qt-"  # external data files: "<output>.qt-<12 hex>.data"
STALE_SECONDS = 600  # a temporary without a known live owner, or an unreferenced data file, this old is stale
OWNED_MAX_SECONDS = 24 * 3600  # even with a live owner pid (pids are reused)
# ".qtool-tmp-<pid>-*", ".qtool-ranges-<pid>-*.tmp"; without a pid (older qtool, reports): by age
_TMP_RE = re.compile(r"^\.qtool-(?:tmp|ranges)-(?:(\d+)-)?[^/]*$|^\.qtool-[^/]*\.tmp$")


_DATA_RE = re.compile(r"^(.+)\." + re.escape(DATA_TOKEN_PREFIX) + r"[0-9a-f]{12}\.data$")


def _ours(name: str, data_file: str) -> bool:
    """``data_file`` is an external data file qtool wrote for the output ``name``."""
    return re.fullmatch(re.escape(name) + r"\." + re.escape(DATA_TOKEN_PREFIX) + r"[0-9a-f]{12}\.data",
                        data_file) is not None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _age(path: str, now: float) -> float:
    try:
        return now - os.lstat(path).st_mtime
    except OSError:
        return 0.0


def clean_stale(folder: str, name: str | None = None) -> list[str]:
    """Remove qtool's own leftovers of killed runs in ``folder``; returns what was removed.

    - temporary folders ``.qtool-tmp-<pid>-*`` and files ``.qtool-ranges-<pid>-*.tmp``
      whose owner process is not running (or, with a running one, older than a
      day: pids are reused); other ``.qtool-*.tmp`` files older than
      :data:`STALE_SECONDS`;
    - external data files ``<output>.qt-<token>.data`` (only those of ``name``,
      when given) that the current ``<output>`` does not reference and that
      are older than :data:`STALE_SECONDS` (a writer moves its data file in
      just before its commit, so a younger one may belong to a run still
      committing).

    Nothing else is touched; errors are ignored (another run may clean at the same time).
    """
    removed = []
    now = time.time()
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        match = _TMP_RE.match(entry)
        if match is None:
            continue
        path = os.path.join(folder, entry)
        age = _age(path, now)
        if match.group(1) is not None:
            stale = not _pid_alive(int(match.group(1))) or age > OWNED_MAX_SECONDS
        else:
            stale = age > STALE_SECONDS
        if stale:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove(path)
            removed.append(entry)
    # data files: grouped by the output they were written for
    owners: dict[str, list[str]] = {}
    for entry in entries:
        match = _DATA_RE.match(entry)
        if match is not None and (name is None or match.group(1) == name):
            owners.setdefault(match.group(1), []).append(entry)
    for owner, candidates in owners.items():
        target = os.path.join(folder, owner)
        referenced = _referenced_data(target) if os.path.lexists(target) else set()
        if referenced is None:  # the target could not be read: keep everything
            continue
        for entry in candidates:
            path = os.path.join(folder, entry)
            if entry not in referenced and _age(path, now) > STALE_SECONDS:
                _remove(path)
                removed.append(entry)
    return removed


def write_text(path, text: str) -> str:
    """Write a text file (a ranges file, a JSON summary, a report) atomically: a temporary file in the
    target folder (with the writer's pid, so a killed run's leftover is cleaned), flushed, renamed."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise QtoolError(f"cannot write '{path}': folder '{folder}' does not exist")
    if os.path.isdir(path):
        raise QtoolError(f"cannot write '{path}': it is a folder")
    clean_stale(folder)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{RANGES_TMP_PREFIX}{os.getpid()}-", suffix=".tmp")
    except OSError as exc:
        raise QtoolError(f"cannot write '{path}': {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise QtoolError(f"cannot write '{path}': {exc.strerror or exc}") from exc
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# the .onnx files whose external data references are read to clean up; bigger ones are inline models
_REFERENCE_SCAN_LIMIT = 256 * 1024 * 1024


def _referenced_data(path: str) -> set[str] | None:
    """The external data locations a model file names (None when it cannot be read).

    Files over :data:`_REFERENCE_SCAN_LIMIT` (inline weights) are not parsed: their bytes
    are scanned for the ``location`` entries of external data, which may find a name too
    many (harmless: a file named is kept, or checked as an input) but never misses one.
    """
    try:
        if os.path.getsize(path) > _REFERENCE_SCAN_LIMIT:
            return _scan_locations(path)
        proto = onnx.load_model(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model file: nothing known
        return None
    return external_locations(proto)


# StringStringEntryProto {key: "location", value: ...}: field 1 (len 8), then field 2
_LOCATION_ENTRY = re.compile(rb"\x0a\x08location\x12([\x80-\xff]?[\x00-\x7f])", re.DOTALL)


def _scan_locations(path: str) -> set[str]:
    found = set()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for match in _LOCATION_ENTRY.finditer(data):
            raw = match.group(1)
            length = raw[0] if len(raw) == 1 else (raw[0] & 0x7F) | (raw[1] << 7)
            value = data[match.end():match.end() + length]
            try:
                found.add(value.decode("utf-8"))
            except UnicodeDecodeError:
                continue
    return found


def external_locations(proto: onnx.ModelProto) -> set[str]:
    """The external data locations named by any tensor of ``proto`` (initializers, sparse
    initializers, tensor attributes, subgraphs and functions)."""
    locations = set()
    for tensor in validate.tensor_protos(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    return locations


def _drop_initializer_value_info(model: ir.Model) -> None:
    """onnx_ir writes a value_info for every typed initializer; the tensor already says it all.

    Dropping them keeps files as small as their inputs and makes a rewrite of a
    rewritten model byte-identical.
    """
    for value in model.graph.initializers.values():
        if value.const_value is not None and not value.is_graph_input() and not value.is_graph_output():
            value.type = None
            value.shape = None


def _fsync(path: str) -> None:
    """Flush a file, or a folder's entries (a rename is durable once its folder is flushed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def light_proto(
    model: ir.Model, *, limit: int = 1024, movable=None
) -> tuple[onnx.ModelProto, dict[str, ir.TensorProtocol]]:
    """A ModelProto of ``model`` whose big initializers are placeholders (external data refs).

    For the onnx C++ APIs (version converter, shape inference), which
    serialize the whole model and fail beyond 2 GB; it also saves copying
    weights they never read. Returns the proto and the name -> tensor map to
    restore them with :func:`restore_tensors`. ``movable(tensor)`` can keep
    some tensors inline.
    """
    saved: dict[str, ir.TensorProtocol] = {}
    values = list(model.graph.initializers.values())
    try:
        for value in values:
            tensor = value.const_value
            if tensor is None or (tensor.nbytes <= limit and not isinstance(tensor, ir.ExternalTensor)):
                continue
            if movable is not None and not movable(tensor):
                continue
            saved[value.name] = tensor
            value.const_value = ir.ExternalTensor(
                validate.PLACEHOLDER, offset=0, length=tensor.nbytes, dtype=tensor.dtype,
                shape=tensor.shape, name=value.name, base_dir="",
            )
        proto = ir.serde.serialize_model(model)
    finally:
        for value in values:
            if value.name in saved:
                value.const_value = saved[value.name]
    return proto, saved


def restore_tensors(model: ir.Model, saved: dict[str, ir.TensorProtocol]) -> None:
    """Put back the tensors :func:`light_proto` replaced, into a model deserialized from it."""
    for name, tensor in saved.items():
        value = model.graph.initializers.get(name)
        if value is not None:
            value.const_value = tensor


# --- opening a model for a command ----------------------------------------------------
def as_ir_model(model) -> ir.Model:
    """An ``onnx_ir.Model`` from a path, a ModelProto or an IR model (returned as is)."""
    if isinstance(model, (str, os.PathLike)):
        return load_model(model).model
    if isinstance(model, onnx.ModelProto):
        if len(model.graph.sparse_initializer):
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            model = copy
        ir_model = model_from_proto(model, "<model>")
        _check_graph_closed(ir_model.graph, "<model>")
        validate.run_checker(light_proto(ir_model)[0], "<model>")
        validate.check_finite_parameters(ir_model.graph, "<model>")
        return ir_model
    if isinstance(model, ir.Model):
        return model
    raise QtoolError(f"model must be a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def model_files(path: str | os.PathLike, model: ir.Model | None = None) -> list[str]:
    """The model file ``path`` and the external data files it references (absolute paths).

    ``model``: the model already loaded from ``path`` (its external tensors are read
    from the IR instead of parsing the file again).
    """
    path = os.path.abspath(os.fspath(path))
    files = [path]
    if model is not None:
        files.extend(os.path.abspath(tensor.path) for _, tensor in external_tensors(model))
    elif os.path.isfile(path):
        base = os.path.dirname(path)
        files.extend(os.path.join(base, loc) for loc in sorted(_referenced_data(path) or ()))
    return list(dict.fromkeys(files))


# A model this large takes half a second or more to read or to write (the zoo's BERT: 13 MB read in 0.12 s; a
# BERT-base, 440 MB, about 5 s): the commands show a progress stage for it. Smaller ones do not, so that a
# mistake found while loading (a model that fails validation, data that does not fit it) stays one line.
LARGE_MODEL_BYTES = 64 << 20


def large_model_bytes(model: str | os.PathLike | ir.Model) -> int | None:
    """The bytes of ``model`` when they reach :data:`LARGE_MODEL_BYTES`, else None: for a path, its file and external
    data on disk (None for a path that cannot be read: loading it says why); for a model, its tensors (what writing
    it writes); None for anything else (a proto in memory)."""
    if isinstance(model, ir.Model):
        size = tensor_bytes(model)
        return size if size >= LARGE_MODEL_BYTES else None
    if not isinstance(model, (str, os.PathLike)):
        return None
    try:
        size = os.path.getsize(model)
        if size < LARGE_MODEL_BYTES:  # the external data may make it large
            size += sum(os.path.getsize(f) for f in model_files(model)[1:] if os.path.isfile(f))
    except OSError:
        return None
    return size if size >= LARGE_MODEL_BYTES else None


def _same_path(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_outputs(outputs, inputs) -> None:
    """Refuse an output that is one of the inputs, or two outputs that are one file, or that
    cannot be written (:func:`check_output_path`).

    ``outputs``/``inputs``: paths (None and non-path entries, like arrays, are
    skipped). Links are resolved and hard links compared. Inputs should list
    every file a command reads: a model's external data files
    (:func:`model_files`), data, ranges files.
    """
    def paths(items):
        return [os.fspath(p) for p in items if isinstance(p, (str, os.PathLike))]

    outs, ins = paths(outputs), paths(inputs)
    for out in outs:
        check_output_path(out)
        for inp in ins:
            if _same_path(out, inp):
                raise QtoolError(f"the output '{out}' is the input '{inp}': qtool never overwrites an input; "
                                 "choose another output path")
    for i, a in enumerate(outs):
        for b in outs[i + 1:]:
            if _same_path(a, b):
                raise QtoolError(f"the outputs '{a}' and '{b}' are the same file")


def check_side_output(path, outputs, inputs) -> None:
    """A second output of a command (a ``--json FILE`` summary, written after the main one) is none
    of the ``inputs`` and not the main ``outputs``; checked before any work. ``path`` None or "-"
    (stdout): nothing to check."""
    if path is None or path == "-":
        return
    check_outputs([path], inputs)
    for out in outputs:
        if isinstance(out, (str, os.PathLike)) and _same_path(os.fspath(path), os.fspath(out)):
            raise QtoolError(f"the outputs '{os.fspath(path)}' and '{os.fspath(out)}' are the same file")


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


@dataclass
class OpenedModel:
    """A model loaded for a rewrite, with where its result goes."""

    model: ir.Model  # a clone when the caller passed an onnx_ir.Model: theirs is never modified
    output: str | None  # the checked output path (the input with in_place)
    external_data: bool  # the input used external data (the output will too)
    label: str  # the name to use in messages
    in_place: bool = False


def open_model(model, output=None, in_place: bool = False, inputs=()) -> OpenedModel:
    """Check the paths and load the model, before any work.

    ``inputs``: the other files the command reads (data, ranges): the output may be none of them,
    nor the model or its external data (except the model itself, with ``in_place``).
    """
    external_in = False
    if isinstance(model, (str, os.PathLike)):
        src_path = os.fspath(model)
        if in_place:
            if output is not None and not same_file(os.fspath(output), src_path):
                raise QtoolError("give either an output path (-o) or --in-place, not both")
            output = src_path
        elif output is not None and os.path.exists(os.fspath(output)) and os.path.exists(src_path) \
                and same_file(os.fspath(output), src_path):
            raise QtoolError(f"the output '{os.fspath(output)}' is the input model; use --in-place to replace it")
        loaded = load_model(src_path)
        ir_model, external_in, label = loaded.model, loaded.external_data, src_path
        read = model_files(src_path, ir_model)
        inputs = list(inputs) + (read[1:] if in_place else read)
    else:
        if in_place:
            raise QtoolError("--in-place needs a model path")
        # the tensors are shared with the caller's model, which is safe: a rewrite never writes into one
        ir_model = model.clone() if isinstance(model, ir.Model) else as_ir_model(model)
        label = "<model>"
    if output is not None:
        output = check_output_path(output)
        check_outputs([output], inputs)
    return OpenedModel(ir_model, output, external_in, label, in_place)
