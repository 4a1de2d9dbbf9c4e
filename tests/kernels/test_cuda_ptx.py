"""Every CUDA kernel compiles to PTX without fused multiply-adds in the quantization arithmetic.

NVVM contracts ``a * b + c`` into ``fma.rn`` by default (even without
fastmath), which changes the last bit; qtool's device functions use
libdevice's ``_rn`` intrinsics, which it never contracts. This compiles each
kernel with ``numba.cuda.compile_ptx`` for sm_80 (no GPU needed) and checks
the instructions: correctly rounded ``mul.rn``/``add.rn``/``sub.rn``/``div.rn``,
``cvt.rmi`` (floor) and ``cvt.rni`` (rint), and no ``fma``, no approximate
division, no flush-to-zero, no ``min``/``max`` (whose NaN rules differ from
the spec's compare-and-select) in the kernels that quantize. A control kernel
shows that the check sees a contraction when there is one.
"""

import os
import re

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("compile_ptx does not exist in the CUDA simulator", allow_module_level=True)
import numba_cuda  # noqa: E402,F401  (CI installs the cuda extra: missing is a failure, not a skip)

from numba import boolean, cuda, float32, float64, int32, int64, types  # noqa: E402

from qtool.kernels import cuda as qcuda  # noqa: E402

CC = (8, 0)


def _a(t):
    return t[::1]


def _a0(t):
    return types.Array(t, 0, "C")


def _qdq_sigs(t):
    a = _a(t)
    return {
        f"qdq_tensor_{t}": (a, a, t, t, t, t, boolean, boolean, t),
        f"qdq_axis_{t}": (a, a, int64, int64, int64, int64, a, a, a, a, boolean, boolean, t),
        f"qdq_tensor_grad_{t}": (a, a, a, t, t, t, t),
        f"qdq_axis_grad_{t}": (a, a, a, int64, int64, int64, int64, a, a, t, t),
        f"qdq_params_from_minmax_{t}": (a, _a(float64), _a(float64), _a(int64), a, a, a, a, a, a, t, t, t, t),
    }


F = _a(float32)
SIGNATURES = {
    "fq_tensor_mul": (F, F, float32, float32, float32, float32, float32),
    "fq_tensor_div": (F, F, float32, float32, float32, float32),
    "fq_tensor_levels": (F, _a(int32), float32, float32, float32, float32, float32),
    "fq_axis_mul": (F, F, int64, int64, int64, int64, F, F, F, F, F),
    "fq_axis_levels": (F, _a(int32), int64, int64, int64, int64, F, F, F, F, F),
    "ql_axis_levels": (F, _a(int32), int64, int64, int64, int64, F, F, F, F),
    "fq_grad_reduce": (F, F, F, F, F, _a(float64), _a(float64), int64, int64, int64, int64),
    **_qdq_sigs(float32),
    **_qdq_sigs(float64),
    "minmax_reduce": (F, _a(float64), _a(float64), _a(int64), int64, int64, int64, int64),
    "minmax_fix": (F, _a(float64), _a(float64), _a(int64), F, F),
    "minmax_fix_scalar": (F, _a(float64), _a(float64), _a(int64), _a0(float32), _a0(float32)),
    "sums_to_f32": (_a(float64), _a(float64), F, F),
    "sums_to_f32_scalar": (_a(float64), _a(float64), _a0(float32), _a0(float32)),
    "fill": (_a(int32), int32),
    "init_minmax": (_a(float64), _a(float64), _a(int64)),
    "zero_f64": (_a(float64), _a(float64)),
}

# instructions each quantizing kernel must contain (its arithmetic, correctly rounded)
EXPECTED = {
    "fq_tensor_mul": {"sub.rn.f32", "mul.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32"},
    "fq_tensor_div": {"sub.rn.f32", "div.rn.f32", "add.rn.f32", "mul.rn.f32", "cvt.rmi.f32.f32"},
    "fq_tensor_levels": {"sub.rn.f32", "div.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32", "cvt.rzi.s32.f32"},
    "fq_axis_mul": {"sub.rn.f32", "mul.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32"},
    "fq_axis_levels": {"sub.rn.f32", "mul.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32", "cvt.rzi.s32.f32"},
    "ql_axis_levels": {"div.rn.f32", "cvt.rni.f32.f32", "add.rn.f32", "cvt.rzi.s32.f32"},
    "fq_grad_reduce": {"mul.rn.f32"},
    "qdq_tensor_float32": {"mul.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32", "cvt.rni.f32.f32"},
    "qdq_axis_float32": {"mul.rn.f32", "add.rn.f32", "cvt.rmi.f32.f32", "cvt.rni.f32.f32"},
    "qdq_tensor_grad_float32": {"mul.rn.f32"},
    "qdq_axis_grad_float32": {"mul.rn.f32"},
    "qdq_params_from_minmax_float32": {"div.rn.f32", "mul.rn.f32"},
    "qdq_tensor_float64": {"mul.rn.f64", "add.rn.f64", "cvt.rmi.f64.f64", "cvt.rni.f64.f64"},
    "qdq_axis_float64": {"mul.rn.f64", "add.rn.f64", "cvt.rmi.f64.f64", "cvt.rni.f64.f64"},
    "qdq_tensor_grad_float64": {"mul.rn.f64"},
    "qdq_axis_grad_float64": {"mul.rn.f64"},
    "qdq_params_from_minmax_float64": {"div.rn.f64", "mul.rn.f64"},
}

# plain float64 adds of the gradient sums (any order is allowed, and there is no float64 multiply to fuse with)
LOOSE_ALLOWED = {"fq_grad_reduce": {"add.f64"}}

FLOAT_OP = re.compile(r"^\s*(?:@%p\d+\s+)?([a-z]+(?:\.[a-z0-9]+)*\.f(?:16|32|64))\b", re.M)


def float_instructions(ptx: str) -> set:
    return set(FLOAT_OP.findall(ptx))


_PTX = {}


def ptx_of(name: str) -> str:
    if name not in _PTX:
        dispatcher = dict(qcuda.kernels())[name]
        _PTX[name], _ = cuda.compile_ptx(dispatcher.py_func, SIGNATURES[name], cc=CC)
    return _PTX[name]


def test_every_kernel_has_a_signature_here():
    assert {name for name, _ in qcuda.kernels()} == set(SIGNATURES)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_kernel_ptx_has_no_fused_multiply_add(name):
    ptx = ptx_of(name)
    ops = float_instructions(ptx)
    assert not re.search(r"\bfma\.", ptx), f"{name}: fused multiply-add in {sorted(ops)}"
    assert not any(".ftz" in op or ".approx" in op or ".full" in op for op in ops), sorted(ops)
    if name in EXPECTED:
        assert EXPECTED[name] <= ops, f"{name}: expected {sorted(EXPECTED[name])}, PTX has {sorted(ops)}"
        # plain (contractible) float arithmetic and NaN-dropping min/max have no place here
        loose = {op for op in ops if re.match(r"(mul|add|sub|div|min|max)\.f(32|64)$", op)}
        assert not loose - LOOSE_ALLOWED.get(name, set()), f"{name}: {sorted(loose)}"


def test_the_check_sees_a_contraction():
    def plain(x, out, a, b):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * a + b

    ptx, _ = cuda.compile_ptx(plain, (F, F, float32, float32), cc=CC)
    assert "fma.rn.f32" in float_instructions(ptx)


def test_float64_subtraction_is_an_add_of_the_negation():
    # there is no dsub_rn in libdevice: a - b is dadd_rn(a, -b), one correctly rounded add
    ops = float_instructions(ptx_of("qdq_axis_float64"))
    assert "add.rn.f64" in ops and "fma.rn.f64" not in ops
