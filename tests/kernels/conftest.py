"""Kernel tests, and their second pass through the CUDA kernels.

Normal runs: nothing happens here but the ``cpu_only`` marker.

On a machine with a GPU, ``QTOOL_TEST_DEVICE=cuda pytest tests/kernels --ignore
tests/kernels/test_cuda.py --ignore tests/kernels/test_cuda_ptx.py`` runs the same pass on the real
device, at full sizes and hypothesis example counts.

With ``QTOOL_TEST_DEVICE=cuda`` (set, together with ``NUMBA_ENABLE_CUDASIM=1``,
by ``test_cuda.py::test_kernel_tests_pass_through_cuda_simulator``, which runs
``tests/kernels`` again in a subprocess) the public kernel functions are
wrapped: numpy tensors go to the device as numba device arrays, the call runs
with ``device="cuda"``, device results come back to the host (scalars where
the CPU returns scalars). Every kernel test then holds the CUDA kernels to the
same expectations, bit for bit. In that pass

* tests marked ``cpu_only`` are skipped;
* in the simulator, a test that passes a tensor of more than ``SIM_MAX_ELEMENTS``
  elements is skipped at that call (the simulator runs a Python thread per CUDA
  thread), and hypothesis tests run at most ``SIM_EXAMPLES`` examples.

Calls that name ``device=`` themselves are not touched.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

CUDA_PASS = os.environ.get("QTOOL_TEST_DEVICE") == "cuda"
IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"  # else a real GPU: full sizes and examples
SIM_MAX_ELEMENTS = 5000
SIM_EXAMPLES = 10

# public function -> its tensor arguments (the ones that move to the device)
TENSOR_ARGS = {
    "fake_quant_with_min_max_args": ("inputs",),
    "fake_quant_with_min_max_args_gradient": ("gradients", "inputs"),
    "fake_quant_with_min_max_vars": ("inputs",),
    "fake_quant_with_min_max_vars_gradient": ("gradients", "inputs"),
    "fake_quant_with_min_max_vars_per_channel": ("inputs",),
    "fake_quant_with_min_max_vars_per_channel_gradient": ("gradients", "inputs"),
    "quantize_and_dequantize_v2": ("input",),
    "quantize_and_dequantize_v2_gradient": ("gradients", "input"),
    "quantize_codes": ("x",),
    "minmax": ("x",),
}


class CudaArrayInterface:
    """Any GPU array library's object, reduced to ``__cuda_array_interface__`` over a numba device array.

    In the simulator, device memory is host memory, so the interface points
    at the simulated array's buffer.
    """

    def __init__(self, dev, read_only=False):
        self._dev = dev  # keeps the memory alive
        if hasattr(dev, "__cuda_array_interface__"):
            desc = dict(dev.__cuda_array_interface__)
        else:  # simulator array: a numpy array inside
            ai = dev._ary.__array_interface__
            desc = {"shape": ai["shape"], "strides": ai["strides"], "typestr": ai["typestr"], "data": ai["data"], "version": 3}
        desc["data"] = (desc["data"][0], bool(read_only))
        desc.setdefault("stream", None)
        self.__cuda_array_interface__ = desc
        self.shape = tuple(desc["shape"])


@pytest.fixture
def cuda_array_interface():
    """The ``CudaArrayInterface`` wrapper class (tests in the simulator pass use it)."""
    return CudaArrayInterface


# Outside the simulator pass the simulator-only module is not collected at all
# (test_cuda.py runs it inside that pass), so a normal run reports no skip.
collect_ignore = [] if CUDA_PASS else ["test_cuda_sim.py"]


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_only: a CPU-specific test, not repeated in the CUDA pass")
    if CUDA_PASS:
        # The simulator's block manager busy-polls threads at syncthreads:
        # a short GIL switch interval keeps it from waiting 5 ms each time.
        sys.setswitchinterval(1e-4)
        _install_cuda_wrappers()


def pytest_collection_modifyitems(config, items):
    if not CUDA_PASS:
        # the test that waits for the simulator pass goes last: the pass runs
        # in the background meanwhile (see pytest_collection_finish)
        waiting = [it for it in items if it.name == SIM_PASS_TEST]
        if waiting:
            items[:] = [it for it in items if it.name != SIM_PASS_TEST] + waiting
        return
    from hypothesis import settings

    skip = pytest.mark.skip(reason="cpu_only: not repeated in the CUDA pass")
    for item in items:
        if "cpu_only" in item.keywords:
            item.add_marker(skip)
        fn = getattr(item, "obj", None)
        current = getattr(fn, "_hypothesis_internal_use_settings", None)
        if IN_SIMULATOR and current is not None and current.max_examples > SIM_EXAMPLES:
            fn._hypothesis_internal_use_settings = settings(current, max_examples=SIM_EXAMPLES)


# --- the CUDA pass ---------------------------------------------------------------------
def _install_cuda_wrappers():
    import qtool
    import qtool.kernels
    from qtool.kernels import api

    for name, tensor_args in TENSOR_ARGS.items():
        wrapped = _through_cuda(getattr(api, name), name, tensor_args)
        for module in (api, qtool.kernels, qtool):
            setattr(module, name, wrapped)


def _to_device(v):
    from numba import cuda

    if not (isinstance(v, np.ndarray) and v.dtype.kind in "fiub"):
        return v  # lists, scalars, odd dtypes: the API converts or rejects them itself
    if IN_SIMULATOR and v.size > SIM_MAX_ELEMENTS:
        pytest.skip(f"a {v.size}-element tensor is too large for the CUDA simulator pass")
    return cuda.to_device(v if v.flags.c_contiguous else v.copy())


def _on_device(v) -> bool:
    return getattr(v, "__cuda_ndarray__", False) is True or hasattr(v, "__cuda_array_interface__")


def _to_host(r, scalar: bool):
    if getattr(r, "__cuda_ndarray__", False) is True:
        h = r.copy_to_host()
        return h[()] if scalar and h.ndim == 0 else h
    return r


def _through_cuda(orig, name, tensor_args):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def call(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return orig(*args, **kwargs)
        a = bound.arguments
        if "device" in a or any(_on_device(a.get(t)) for t in tensor_args):
            return orig(*args, **kwargs)  # the test chose: leave it alone
        for t in tensor_args:
            if t in a:
                a[t] = _to_device(a[t])
        host_out = a.get("out")
        dev_out = None
        if isinstance(host_out, np.ndarray):
            from numba import cuda

            dev = cuda.to_device(host_out.copy())
            dev_out = CudaArrayInterface(dev, read_only=True) if not host_out.flags.writeable else dev
            a["out"] = dev_out
        a["device"] = "cuda"
        res = orig(*bound.args, **bound.kwargs)
        if dev_out is not None:
            host_out[...] = dev.copy_to_host()
        if name == "fake_quant_with_min_max_vars_gradient":
            scalars = (False, True, True)
        elif name == "minmax" and a.get("axis") is None:
            scalars = (True, True)
        else:
            scalars = None
        if isinstance(res, tuple):
            return tuple(
                host_out if (dev_out is not None and r is dev_out) else _to_host(r, bool(scalars and scalars[i]))
                for i, r in enumerate(res)
            )
        return host_out if (dev_out is not None and res is dev_out) else _to_host(res, False)

    return call


# --- the simulator pass, run in a subprocess ------------------------------------------------------
SIM_PASS_TEST = "test_kernel_tests_pass_through_cuda_simulator"
SIM_PASS_TIMEOUT = 900
KERNEL_TESTS = Path(__file__).resolve().parent
ROOT = KERNEL_TESTS.parent.parent
_sim_pass: dict = {}


def sim_pass_available() -> bool:
    try:
        return importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):
        return False


def _start_sim_pass():
    """``pytest tests/kernels`` again, through the CUDA kernels in the simulator, in the background."""
    if _sim_pass:
        return
    log = tempfile.TemporaryFile(mode="w+", prefix="qtool-cuda-sim-")
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning",
        "--ignore", str(KERNEL_TESTS / "test_cuda.py"), "--ignore", str(KERNEL_TESTS / "test_cuda_ptx.py"),
        str(KERNEL_TESTS),
    ]  # fmt: skip
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", QTOOL_TEST_DEVICE="cuda")
    _sim_pass.update(
        proc=subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
        log=log, started=time.monotonic(), cmd=" ".join(cmd),
    )  # fmt: skip


def pytest_collection_finish(session):
    if CUDA_PASS or session.config.option.collectonly or not sim_pass_available():
        return
    if any(it.name == SIM_PASS_TEST for it in session.items):
        _start_sim_pass()


def pytest_sessionfinish(session, exitstatus):
    proc = _sim_pass.get("proc")
    if proc is not None and proc.poll() is None:  # the waiting test did not run (-x, interrupted)
        proc.kill()
        proc.wait()
    if _sim_pass.get("log") is not None:
        _sim_pass["log"].close()


@pytest.fixture
def cuda_simulator_pass():
    """``(returncode, output, seconds)`` of the simulator pass (started at collection, or now)."""
    _start_sim_pass()
    proc, log = _sim_pass["proc"], _sim_pass["log"]
    try:
        rc = proc.wait(timeout=max(1.0, SIM_PASS_TIMEOUT - (time.monotonic() - _sim_pass["started"])))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    if "output" not in _sim_pass:
        log.seek(0)
        _sim_pass["output"] = log.read()
    return rc, _sim_pass["output"], time.monotonic() - _sim_pass["started"]
