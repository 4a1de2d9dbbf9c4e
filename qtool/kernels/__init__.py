"""Quantization kernels that match TensorFlow bit for bit (see spec/kernels.md)."""

from qtool.kernels.api import (  # noqa: F401
    CudaUnavailableError,
    fake_quant_with_min_max_args,
    fake_quant_with_min_max_args_gradient,
    fake_quant_with_min_max_vars,
    fake_quant_with_min_max_vars_gradient,
    fake_quant_with_min_max_vars_per_channel,
    fake_quant_with_min_max_vars_per_channel_gradient,
    minmax,
    nudged_range,
    quantize_and_dequantize_v2,
    quantize_and_dequantize_v2_gradient,
    quantize_codes,
)
from qtool.kernels.api import __all__  # noqa: F401
from qtool.kernels.histogram import (  # noqa: F401,E402  (streaming range statistics for calibration)
    Histogram,
    entropy_range,
    mse_range,
    percentile_range,
)

# (the function ``histogram.histogram`` stays in its module: exported, it would hide the module)
__all__ = [*__all__, "Histogram", "percentile_range", "entropy_range", "mse_range"]
