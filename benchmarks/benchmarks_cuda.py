"""CUDA part of ``benchmarks/kernels.py``: ``python benchmarks/kernels.py --device cuda [--sizes 26,27,28]``.

For each float32 tensor of 2**k elements on the GPU it times, with CUDA events:

* a device-to-device copy of the tensor (``cuMemcpyDtoD``): the memory
  bandwidth baseline, read + write of ``4 n`` bytes each;
* every kernel twice: the kernel alone (``qtool.kernels.cuda`` launchers on
  preallocated buffers, parameters computed beforehand) and the public call
  users make (device arrays in, validation, parameters, output allocation);
* PyTorch's ``fake_quantize_per_tensor_affine`` / ``_per_channel_affine`` on
  the same data, when PyTorch with CUDA is installed.

It prints each kernel's achieved bandwidth (bytes it must move / time) as a
fraction of the copy's (goal: >= 0.85 for the single-pass kernels), and
PyTorch's time over qtool's for the fake-quant forward (> 1: qtool faster).
Bytes counted: every input read once and the output written once; the
``range_given=False`` quantize-dequantize reads its input twice (min/max, then
the forward) and counts both reads.

Without a GPU it stops with a message; under the numba CUDA simulator it runs
(``--sizes 10``) but the times mean nothing.
"""

from __future__ import annotations

import numpy as np

f32 = np.float32


def _events_time(cuda, fn, repeat: int) -> float:
    """Best of ``repeat`` GPU times of ``fn()`` in seconds (CUDA events on the default stream)."""
    fn()  # warm-up: compilation, allocations
    cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def _torch_time(torch, fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main(args) -> None:
    import qtool
    from qtool.kernels import api

    try:
        cu = api._load_cuda()
        ok, why = cu.available()
    except api.CudaUnavailableError as exc:
        raise SystemExit(f"benchmarks/kernels.py --device cuda: {exc}") from None
    if not ok:
        raise SystemExit(f"benchmarks/kernels.py --device cuda: no CUDA GPU is available ({why})")
    from numba import cuda

    try:
        import torch

        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None

    dev = cuda.get_current_device()
    name = getattr(dev, "name", "the CUDA simulator")
    name = name.decode() if isinstance(name, bytes) else name
    print(f"qtool {qtool.__version__} on {name}{' (simulator: times are meaningless)' if cu.SIM else ''}; "
          f"PyTorch {'%s' % torch.__version__ if torch else 'not installed (or no CUDA)'}")
    repeat = args.repeat
    rng = np.random.default_rng(0)
    for k in (int(s) for s in args.sizes.split(",")):
        n = 1 << k
        x = cuda.to_device(rng.normal(0, 2, n).astype(f32))
        g = cuda.to_device(rng.normal(0, 1, n).astype(f32))
        out = cuda.device_array(n, f32)
        codes = cuda.device_array(n, np.int32)
        depth = 64
        pc_x = x.reshape(n // depth, depth)
        pc_g = g.reshape(n // depth, depth)
        pc_min, pc_max = np.full(depth, -3, f32), np.full(depth, 3, f32)

        t_copy = _events_time(cuda, lambda: out.copy_to_device(x), repeat)
        bw_copy = 8 * n / t_copy
        print(f"\n2^{k} float32 elements ({4 * n / 2**20:.0f} MiB): device-to-device copy {t_copy * 1e3:.3f} ms "
              f"({bw_copy / 1e9:.0f} GB/s)")

        # parameters as the API computes them (for the kernel-only timings)
        nmin, nmax, scale, inv, _, qz, lo, hi = api._nudge_arrays(np.array([f32(-3)]), np.array([f32(3)]), 8, False, np.zeros(1, bool))
        pnmin, pnmax, pscale, pinv, pzp, pqz, plo, phi = api._nudge_arrays(pc_min, pc_max, 8, False, np.zeros(depth, bool))
        dev_params = [cu._dev(a, f32) for a in (pnmin, pnmax, pscale, pinv, pqz, plo, phi)]
        q_scale, q_inv = f32(127) / f32(3), f32(3) / f32(127)
        one, zero, half, big = f32(1), f32(0), f32(0.5), f32(np.finfo(f32).max)
        fx, fg = x, g

        # (name, bytes moved in units of 4 n, kernel-only call, public call)
        cases = [
            ("fake_quant_with_min_max_args", 2,
             lambda: cu.fq_tensor_mul(fx, out, nmin[0], nmax[0], scale[0], inv[0], qz[0]),
             lambda: qtool.fake_quant_with_min_max_args(x, -3.0, 3.0, out=out)),
            ("fake_quant_with_min_max_vars", 2,
             lambda: cu.fq_tensor_div(fx, out, nmin[0], nmax[0], scale[0], qz[0]),
             lambda: qtool.fake_quant_with_min_max_vars(x, -3.0, 3.0, out=out)),
            ("fake_quant_with_min_max_vars_per_channel (64 ch)", 2,
             lambda: cu.fq_axis_mul(fx, out, depth, 1, *dev_params[:5]),
             lambda: qtool.fake_quant_with_min_max_vars_per_channel(pc_x, pc_min, pc_max, out=out.reshape(n // depth, depth))),
            ("fake_quant_with_min_max_args_gradient", 3,
             lambda: cu.qdq_tensor_grad(fg, fx, out, lo[0], hi[0], one, zero),
             lambda: qtool.fake_quant_with_min_max_args_gradient(g, x, -3.0, 3.0, out=out)),
            ("fake_quant_with_min_max_vars_gradient", 3,
             lambda: cu.fq_tensor_grad(fg, fx, out, lo[0], hi[0]),
             lambda: qtool.fake_quant_with_min_max_vars_gradient(g, x, -3.0, 3.0, out=out)),
            ("fake_quant_..._per_channel_gradient (64 ch)", 3,
             lambda: cu.fq_axis_grad(fg, fx, out, depth, 1, dev_params[5], dev_params[6]),
             lambda: qtool.fake_quant_with_min_max_vars_per_channel_gradient(pc_g, pc_x, pc_min, pc_max, out=out.reshape(n // depth, depth))),
            ("quantize_and_dequantize_v2 range_given", 2,
             lambda: cu.qdq_tensor(fx, out, f32(-3), f32(3), q_scale, q_inv, True, False, half),
             lambda: qtool.quantize_and_dequantize_v2(x, -3.0, 3.0, range_given=True, out=out)),
            ("quantize_and_dequantize_v2 (data range, 2 passes)", 3,
             lambda: _qdq_data(cu, fx, out, half, big),
             lambda: qtool.quantize_and_dequantize_v2(x, 0.0, 0.0, out=out)),
            ("quantize_and_dequantize_v2_gradient", 3,
             lambda: cu.qdq_tensor_grad(fg, fx, out, f32(-3), f32(3), one, zero),
             lambda: qtool.quantize_and_dequantize_v2_gradient(g, x, -3.0, 3.0, out=out)),
            ("quantize_codes", 2,
             lambda: cu.fq_tensor_levels(fx, codes, nmin[0], nmax[0], scale[0], qz[0], f32(pzp[0])),
             lambda: qtool.quantize_codes(x, -3.0, 3.0)),
            ("minmax", 1,
             lambda: cu.minmax_tensor(fx),
             lambda: qtool.minmax(x)),
        ]  # fmt: skip
        print(f"  {'kernel':52s} {'kernel ms':>10s} {'vs copy':>8s} {'call ms':>9s} {'vs copy':>8s}")
        times = {}
        for label, units, kernel_fn, call_fn in cases:
            tk = _events_time(cuda, kernel_fn, repeat)
            tc = _events_time(cuda, call_fn, repeat)
            times[label] = tk
            bw = units * 4 * n
            print(f"  {label:52s} {tk * 1e3:10.3f} {bw / tk / bw_copy:8.2f} {tc * 1e3:9.3f} {bw / tc / bw_copy:8.2f}")

        if torch is not None:
            tx = torch.as_tensor(x, device="cuda")  # zero-copy through __cuda_array_interface__
            tpc = tx.view(n // depth, depth)
            sc = torch.full((depth,), 6 / 255, device="cuda")
            zp = torch.full((depth,), 128, dtype=torch.int32, device="cuda")
            t_pt = _torch_time(torch, lambda: torch.fake_quantize_per_tensor_affine(tx, 6 / 255, 128, 0, 255), repeat)
            t_pc = _torch_time(torch, lambda: torch.fake_quantize_per_channel_affine(tpc, sc, zp, 1, 0, 255), repeat)
            q_pt = times["fake_quant_with_min_max_args"]
            q_pc = times["fake_quant_with_min_max_vars_per_channel (64 ch)"]
            print(f"  PyTorch fake_quantize_per_tensor_affine  {t_pt * 1e3:8.3f} ms ({8 * n / t_pt / bw_copy:.2f} of copy); "
                  f"PyTorch / qtool = {t_pt / q_pt:.2f}")
            print(f"  PyTorch fake_quantize_per_channel_affine {t_pc * 1e3:8.3f} ms ({8 * n / t_pc / bw_copy:.2f} of copy); "
                  f"PyTorch / qtool = {t_pc / q_pc:.2f}")


def _qdq_data(cu, x, out, half, big):
    scale, inv, lo, hi = cu.qdq_params_from_minmax(x, 1, 1, f32(-128), f32(127), big)
    cu.qdq_axis(x, out, 1, 1, lo, hi, scale, inv, False, False, half)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="26,27,28", help="log2 of the element counts")
    ap.add_argument("--repeat", type=int, default=20)
    main(ap.parse_args())
