"""save_model: the .onnx rename is the one commit point, whatever happens between the steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import onnx
import pytest
from model_files import ROOT, data_files, gemm_model, gemm_proto, referenced, weight_fill

from qtool.api import rewrite_eval
from qtool.errors import QtoolError
from qtool.model import io as _io

STEPS = ["written", "data moved", "committed"]


class Boom(Exception):
    pass


def fail_at(monkeypatch, step: str, action=None):
    """Make save_model stop (raise Boom) at ``step``, after running ``action`` there."""
    def hook(name):
        if name == step:
            if action is not None:
                action()
            raise Boom(name)

    monkeypatch.setattr(_io, "_step", hook)


def leftovers(folder) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.startswith(".qtool-"))


def make_old(tmp_path):
    out = tmp_path / "m.onnx"
    _io.save_model(gemm_model(1.0), out, external_data=True)
    return out


def test_external_data_gets_a_new_name_each_write_and_the_old_one_goes(tmp_path):
    out = make_old(tmp_path)
    first = data_files(tmp_path, "m.onnx")
    assert len(first) == 1 and referenced(out) == set(first)
    name = _io.save_model(gemm_model(2.0), out, external_data=True)
    assert data_files(tmp_path, "m.onnx") == [name] != first
    assert referenced(out) == {name}
    assert weight_fill(out) == 2.0
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("step", STEPS)
def test_a_failure_between_steps_leaves_the_old_or_the_new_model_complete(tmp_path, monkeypatch, step):
    out = make_old(tmp_path)
    old_bytes = out.read_bytes()
    fail_at(monkeypatch, step)
    with pytest.raises(Boom):
        _io.save_model(gemm_model(2.0), out, external_data=True)
    if step == "committed":
        assert weight_fill(out) == 2.0
    else:
        assert out.read_bytes() == old_bytes and weight_fill(out) == 1.0
        assert len(data_files(tmp_path, "m.onnx")) == 1  # the new data file was removed
    assert leftovers(tmp_path) == []


def test_a_failed_rename_of_the_model_file_leaves_the_old_model(tmp_path, monkeypatch):
    out = make_old(tmp_path)
    old_bytes, old_data = out.read_bytes(), data_files(tmp_path, "m.onnx")
    real = os.replace

    def replace(src, dst):
        if os.fspath(dst) == os.fspath(out):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(QtoolError, match="cannot write .*m.onnx.*No space left on device"):
        _io.save_model(gemm_model(2.0), out, external_data=True)
    assert out.read_bytes() == old_bytes and weight_fill(out) == 1.0
    assert data_files(tmp_path, "m.onnx") == old_data
    assert leftovers(tmp_path) == []


def test_orphans_of_an_interrupted_commit_are_cleaned_when_stale(tmp_path, monkeypatch):
    out = make_old(tmp_path)
    old_data = data_files(tmp_path, "m.onnx")
    fail_at(monkeypatch, "committed")  # the old data file stays behind
    with pytest.raises(Boom):
        _io.save_model(gemm_model(2.0), out, external_data=True)
    monkeypatch.setattr(_io, "_step", lambda name: None)
    current = referenced(out)
    orphans = set(data_files(tmp_path, "m.onnx")) - current
    assert orphans == set(old_data)
    # young: it may belong to a writer about to commit, so it stays
    _io.save_model(gemm_model(3.0), tmp_path / "other.onnx")
    assert set(data_files(tmp_path, "m.onnx")) == current | orphans
    # old enough: removed by the next save in the folder of that output
    past = time.time() - _io.STALE_SECONDS - 5
    for name in orphans:
        os.utime(tmp_path / name, (past, past))
    (tmp_path / "user.onnx.data").write_bytes(b"not ours")
    os.utime(tmp_path / "user.onnx.data", (past, past))
    assert _io.clean_stale(str(tmp_path), "m.onnx") == sorted(orphans)
    assert set(data_files(tmp_path, "m.onnx")) == current
    assert weight_fill(out) == 2.0 and (tmp_path / "user.onnx.data").exists()


def test_concurrent_writers_end_with_one_complete_result(tmp_path, monkeypatch):
    """Writer A is between moving its data in and its commit when writer B writes the same
    path from start to end; A commits last: the target is A's model, complete."""
    out = make_old(tmp_path)
    inner_done = []

    def writer_b():
        monkeypatch.setattr(_io, "_step", lambda name: None)
        inner_done.append(_io.save_model(gemm_model(3.0), out, external_data=True))
        monkeypatch.setattr(_io, "_step", hook)

    def hook(name):
        if name == "data moved" and not inner_done:
            writer_b()

    monkeypatch.setattr(_io, "_step", hook)
    a_data = _io.save_model(gemm_model(2.0), out, external_data=True)
    assert inner_done and weight_fill(out) == 2.0 and referenced(out) == {a_data}
    # B's data file is not referenced any more; it goes once stale
    past = time.time() - _io.STALE_SECONDS - 5
    os.utime(tmp_path / inner_done[0], (past, past))
    _io.clean_stale(str(tmp_path), "m.onnx")
    assert data_files(tmp_path, "m.onnx") == [a_data]


def test_in_place_never_rewrites_the_input_data_file(tmp_path, monkeypatch):
    src = tmp_path / "m.onnx"
    onnx.save(gemm_proto(1.0), src, save_as_external_data=True, location="m.onnx.data", size_threshold=64)
    before = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    for step in ("written", "data moved"):
        fail_at(monkeypatch, step)
        with pytest.raises(Boom):
            rewrite_eval(str(src), in_place=True)
        assert {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)} == before
    monkeypatch.setattr(_io, "_step", lambda name: None)
    first = rewrite_eval(str(src), in_place=True).summary["external_data"]
    assert referenced(src) == {first}
    # the data file qtool did not write is left alone; the one it wrote is replaced by the next write
    assert (tmp_path / "m.onnx.data").read_bytes() == before["m.onnx.data"]
    rewrite_eval(str(src), in_place=True)
    assert not (tmp_path / first).exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["m.onnx", "m.onnx.data"] + list(referenced(src)))
    _io.load_model(src)


def test_stale_temporaries_of_dead_runs_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        f".qtool-tmp-{dead.pid}-abc": "dir",  # a killed save_model
        f".qtool-ranges-{dead.pid}-xyz.tmp": "file",  # a killed ranges writer
        f".qtool-tmp-{os.getpid()}-live": "dir",  # a save in progress (this process)
        ".qtool-tmp-oldstyle": "dir",  # no pid: by age
        ".qtool-report.tmp": "file",  # no pid: by age, young
    }
    for name, kind in names.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "m.onnx").write_bytes(b"partial")
        else:
            (tmp_path / name).write_bytes(b"partial")
    (tmp_path / "keep.tmp").write_bytes(b"user file")
    past = time.time() - _io.STALE_SECONDS - 5
    os.utime(tmp_path / ".qtool-tmp-oldstyle", (past, past))
    _io.save_model(gemm_model(1.0), tmp_path / "m.onnx")
    assert leftovers(tmp_path) == sorted([f".qtool-tmp-{os.getpid()}-live", ".qtool-report.tmp"])
    assert (tmp_path / "keep.tmp").exists()


KILLER = textwrap.dedent("""
    import sys, time
    from qtool.model import io
    sys.path.insert(0, {tests!r})
    from model_files import gemm_model

    def hook(name):
        if name == {step!r}:
            open({marker!r}, "w").write(name)
            time.sleep(60)

    io._step = hook
    io.save_model(gemm_model(2.0), {out!r}, external_data=True)
""")


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_during_a_write(tmp_path, step):
    """A real SIGKILL at each step of a write: the target is the complete old or new model, and
    the next save in the folder removes what the killed run left."""
    out = make_old(tmp_path)
    marker = tmp_path.parent / f"{tmp_path.name}.marker"
    script = KILLER.format(tests=str(ROOT / "tests" / "model"), step=step, marker=str(marker), out=str(out))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env)
    try:
        deadline = time.time() + 60
        while not marker.exists():
            assert proc.poll() is None, "the writer ended before reaching the step"
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert weight_fill(out) == (2.0 if step == "committed" else 1.0)
    assert any(f.startswith(f".qtool-tmp-{proc.pid}-") for f in os.listdir(tmp_path))
    past = time.time() - _io.STALE_SECONDS - 5
    for name in data_files(tmp_path, "m.onnx"):
        os.utime(tmp_path / name, (past, past))
    _io.save_model(gemm_model(3.0), tmp_path / "other.onnx")  # any save in the folder cleans up
    assert leftovers(tmp_path) == []
    assert data_files(tmp_path, "m.onnx") == sorted(referenced(out))
    assert weight_fill(out) == (2.0 if step == "committed" else 1.0)

