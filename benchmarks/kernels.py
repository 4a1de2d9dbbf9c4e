"""Kernel speed against a memory-bandwidth baseline measured in the same run.

    python benchmarks/kernels.py [--sizes 24,25,26] [--repeat 7] [--device cpu]

For each float32 tensor of 2**k elements it times every public kernel (the
call users make: validation, allocation of the output, the jitted pass) and
prints the ratio ``baseline_time / kernel_time``, where the baseline is a
numba parallel loop that reads the input and writes a freshly allocated
output of the same size (1.0 = the kernel runs at the speed of memory).
Kernels that read two inputs (gradients) are compared with a baseline that
reads two arrays. It also prints each kernel's speed-up over a plain numpy
implementation of the same formula. Goals: single-pass kernels >= 0.9,
quantize_and_dequantize_v2 with range_given=False (two passes) >= 0.6.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit, prange

import qtool

f32 = np.float32


@njit(parallel=True, cache=True)
def _copy1_into(x, out):
    for i in prange(x.size):
        out[i] = x[i]


@njit(parallel=True, cache=True)
def _copy2_into(a, b, out):
    for i in prange(a.size):
        out[i] = a[i] + b[i]


# The output is allocated the way qtool allocates it (np.empty: numpy asks the
# kernel for huge pages), so the baseline pays the same first-touch cost.
def _copy1(x):
    out = np.empty_like(x)
    _copy1_into(x, out)
    return out


def _copy2(a, b):
    out = np.empty_like(a)
    _copy2_into(a, b, out)
    return out


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up (compilation, page faults of the first allocation)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def numpy_fake_quant(x, mn, mx):
    nmin, nmax, scale, _ = qtool.nudged_range(mn, mx)
    inv = f32(255) / (f32(mx) - f32(mn))
    qz = np.floor(-nmin * inv + f32(0.5))
    return np.floor((np.clip(x, nmin, nmax) - nmin) * inv - qz + f32(0.5)) * scale


def numpy_qdq(x):
    lo, hi = x.min(), x.max()
    scale = f32(127) / hi if hi > -lo * f32(127 / 128) else f32(-128) / lo
    return np.rint(x * scale) / scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="24,25,26", help="log2 of the element counts")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    if args.device == "cuda":
        from benchmarks_cuda import main as cuda_main  # noqa: PLC0415

        cuda_main(args)
        return

    from numba import get_num_threads

    print(f"qtool {qtool.__version__}, numba threads: {get_num_threads()}")
    rng = np.random.default_rng(0)
    for k in (int(s) for s in args.sizes.split(",")):
        n = 1 << k
        x = rng.normal(0, 2, n).astype(f32)
        g = rng.normal(0, 1, n).astype(f32)
        pc_x = x.reshape(-1, 64)
        pc_min, pc_max = np.full(64, -3, f32), np.full(64, 3, f32)
        base1 = best_time(lambda: _copy1(x), args.repeat)
        base2 = best_time(lambda: _copy2(x, g), args.repeat)
        gbs = 8 * n / base1 / 1e9
        print(f"\n2^{k} float32 elements ({4 * n / 2**20:.0f} MiB): baseline read+write {base1 * 1e3:.1f} ms ({gbs:.1f} GB/s), "
              f"read2+write {base2 * 1e3:.1f} ms")
        cases = [
            ("fake_quant_with_min_max_args", 1, lambda: qtool.fake_quant_with_min_max_args(x, -3.0, 3.0), lambda: numpy_fake_quant(x, -3.0, 3.0)),
            ("fake_quant_with_min_max_vars", 1, lambda: qtool.fake_quant_with_min_max_vars(x, -3.0, 3.0), None),
            ("fake_quant_with_min_max_vars_per_channel (64 ch)", 1, lambda: qtool.fake_quant_with_min_max_vars_per_channel(pc_x, pc_min, pc_max), None),
            ("fake_quant_with_min_max_args_gradient", 2, lambda: qtool.fake_quant_with_min_max_args_gradient(g, x, -3.0, 3.0), None),
            ("fake_quant_with_min_max_vars_gradient", 2, lambda: qtool.fake_quant_with_min_max_vars_gradient(g, x, -3.0, 3.0), None),
            ("fake_quant_..._per_channel_gradient (64 ch)", 2, lambda: qtool.fake_quant_with_min_max_vars_per_channel_gradient(g.reshape(-1, 64), pc_x, pc_min, pc_max), None),
            ("quantize_and_dequantize_v2 range_given", 1, lambda: qtool.quantize_and_dequantize_v2(x, -3.0, 3.0, range_given=True), None),
            ("quantize_and_dequantize_v2 (2 passes)", 1, lambda: qtool.quantize_and_dequantize_v2(x, -3.0, 3.0), lambda: numpy_qdq(x)),
            ("quantize_and_dequantize_v2_gradient", 2, lambda: qtool.quantize_and_dequantize_v2_gradient(g, x, -3.0, 3.0), None),
        ]
        print(f"  {'kernel':52s} {'ms':>8s} {'vs baseline':>12s} {'vs numpy':>9s}")
        for name, reads, fn, np_fn in cases:
            t = best_time(fn, args.repeat)
            ratio = (base1 if reads == 1 else base2) / t
            vs_np = f"{best_time(np_fn, 2) / t:8.1f}x" if np_fn else ""
            print(f"  {name:52s} {t * 1e3:8.1f} {ratio:12.2f} {vs_np:>9s}")


if __name__ == "__main__":
    main()
