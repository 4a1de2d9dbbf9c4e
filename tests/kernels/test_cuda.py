"""CUDA support: the simulator pass of the kernel tests, device selection, and the errors.

``test_kernel_tests_pass_through_cuda_simulator`` checks the CUDA kernels on
every run without a GPU: ``conftest.py`` starts ``pytest tests/kernels`` in a
subprocess under the numba CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, which
has to be set before numba.cuda is first imported, hence the subprocess) with
every kernel test going through the CUDA kernels, plus ``test_cuda_sim.py``
(CUDA against CPU, bit for bit). It runs in the background while the rest of
the suite runs; this test waits for it and is scheduled last.

The other tests here need neither a GPU nor the simulator: the errors when
CUDA is asked for where it cannot run.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import qtool
from qtool.errors import QtoolError
from qtool.kernels import api

f32 = np.float32
X = np.linspace(-2, 2, 9, dtype=f32)
IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ROOT = Path(__file__).resolve().parents[2]


def sim_pass_available() -> bool:
    """numba-cuda (the cuda extra) is installed."""
    try:
        return importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):
        return False


class GpuArrayStandIn:
    """An object with ``__cuda_array_interface__`` and no memory behind it (errors come before any access)."""

    shape = (9,)
    __cuda_array_interface__ = {"shape": (9,), "typestr": "<f4", "data": (0, False), "strides": None, "version": 3}


def _gpu_available() -> bool:
    if not sim_pass_available() or IN_SIMULATOR:
        return IN_SIMULATOR
    from numba import cuda

    return cuda.is_available()


@pytest.mark.skipif(os.environ.get("QTOOL_TEST_DEVICE") == "cuda", reason="already the CUDA pass")
def test_kernel_tests_pass_through_cuda_simulator(cuda_simulator_pass):
    rc, out, seconds = cuda_simulator_pass
    tail = out[-12000:]
    assert rc == 0, f"the CUDA simulator pass failed (rc={rc}, {seconds:.0f} s):\n{tail}"
    last = out.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "error" not in last, tail


def test_device_argument_is_checked():
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or None \(where the data lives\), got 'gpu'"):
        qtool.fake_quant_with_min_max_args(X, device="gpu")
    with pytest.raises(ValueError, match="device must be"):
        qtool.minmax(X, device=0)


def test_host_data_runs_on_the_cpu_by_default_and_on_request():
    want = qtool.fake_quant_with_min_max_vars(X, -1.0, 1.0)
    got = qtool.fake_quant_with_min_max_vars(X, -1.0, 1.0, device="cpu")
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    d, dmin, dmax = qtool.fake_quant_with_min_max_vars_gradient(X, X, -1.0, 1.0, device="cpu")
    assert isinstance(dmin, np.float32)


def test_mixing_host_and_gpu_tensors_is_an_error():
    with pytest.raises(ValueError, match=r"gradients is on the GPU but inputs on the host: .*device='cuda' / device='cpu'"):
        qtool.fake_quant_with_min_max_args_gradient(GpuArrayStandIn(), X)
    with pytest.raises(ValueError, match=r"input is on the GPU but gradients on the host"):
        qtool.quantize_and_dequantize_v2_gradient(X, GpuArrayStandIn(), -1.0, 1.0)


@pytest.mark.skipif(_gpu_available(), reason="a GPU is available")
def test_cuda_without_a_gpu_is_a_clear_error():
    if not sim_pass_available():
        match = r"numba-cuda .* not installed: pip install 'qtool\[cuda\]'"
    else:
        match = r"CUDA was requested but no CUDA GPU is available: \S"
    for call in (
        lambda: qtool.fake_quant_with_min_max_vars(X, -1.0, 1.0, device="cuda"),
        lambda: qtool.fake_quant_with_min_max_vars(GpuArrayStandIn(), -1.0, 1.0),  # GPU data: CUDA implied
        lambda: qtool.minmax(X, device="cuda"),
        lambda: qtool.quantize_and_dequantize_v2_gradient(GpuArrayStandIn(), GpuArrayStandIn(), 0.0, 1.0),
    ):
        with pytest.raises(api.CudaUnavailableError, match=match) as info:
            call()
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, QtoolError)


WITHOUT_NUMBA_CUDA = textwrap.dedent(
    """
    import sys
    sys.modules["numba_cuda"] = None  # as if the cuda extra were not installed
    import numpy as np
    import qtool
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    want = qtool.fake_quant_with_min_max_vars(x, -1.0, 1.0)
    qtool.quantize_and_dequantize_v2(x.reshape(3, 3), np.zeros(3), np.zeros(3), axis=0)
    qtool.minmax(x)
    # CPU work never imports the CUDA side
    assert "qtool.kernels.cuda" not in sys.modules and "numba.cuda" not in sys.modules, sorted(sys.modules)

    class Gpu:
        shape = (9,)
        __cuda_array_interface__ = {"shape": (9,), "typestr": "<f4", "data": (0, False), "version": 3}

    from qtool.kernels.api import CudaUnavailableError
    for call in (
        lambda: qtool.fake_quant_with_min_max_vars(x, -1.0, 1.0, device="cuda"),
        lambda: qtool.fake_quant_with_min_max_vars(Gpu(), -1.0, 1.0),
    ):
        try:
            call()
        except CudaUnavailableError as exc:
            assert "pip install 'qtool[cuda]'" in str(exc), exc
            assert "numba-cuda" in str(exc), exc
        else:
            raise AssertionError("no error")
    # and the CPU keeps working after the failed request
    assert (qtool.fake_quant_with_min_max_vars(x, -1.0, 1.0) == want).all()
    print("OK")
    """
)


def test_without_numba_cuda_the_cpu_works_and_cuda_requests_name_the_extra():
    r = subprocess.run([sys.executable, "-c", WITHOUT_NUMBA_CUDA], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


@pytest.mark.skipif(IN_SIMULATOR, reason="checks launches outside the simulator")
def test_small_launches_do_not_warn_about_occupancy():
    # numba warns on every launch of fewer than 128 blocks; small tensors and the
    # one-thread finishing kernels launch such grids on purpose
    import warnings

    from qtool.kernels import cuda as qcuda

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = qcuda._launch(qcuda.fill, 3, qcuda.TPB)
        assert qcuda._launch(qcuda.fill, 3, qcuda.TPB) is first  # configured once
        qcuda._launch(qcuda.minmax_fix_scalar, 1, 1)


def test_gpu_objects_that_refuse_the_interface_still_count_as_gpu_data():
    class RequiresGrad:  # PyTorch raises RuntimeError for a CUDA tensor that requires grad
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    assert api._is_device_array(RequiresGrad())
    assert not api._is_device_array(X) and not api._is_device_array([1.0])
