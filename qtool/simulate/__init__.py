"""Accuracy and error reports: what quantization costs, and where.

- ``config``: :class:`SimulateConfig`, the options, checked in one place;
- ``core``: :func:`run_simulation`, the story (load, quantize in memory or
  take the given models, plan, one pass over the data); ``qtool.api.simulate``
  calls it with the what-if table's quantizer;
- ``inputs``: models (through the one model loader) and data;
- ``whatif``: the what-if models, quantized in memory from one calibration;
- ``graph``: reading a QDQ model against its float model (quantizers, float
  counterparts, single-layer models for ``--sensitivity``);
- ``compare``: what each model reads, and its streaming sums;
- ``session``: onnxruntime sessions without serializing whole models;
- ``result``: :class:`SimulateResult`, typed; dicts only in ``to_dict()``;
- ``report``: the report as text for the terminal and as JSON;
- ``html``: the self-contained HTML page with its plots.
"""

from qtool.simulate.config import SimulateConfig
from qtool.simulate.core import run_simulation
from qtool.simulate.result import SimulateResult

__all__ = ["SimulateConfig", "SimulateResult", "run_simulation"]
