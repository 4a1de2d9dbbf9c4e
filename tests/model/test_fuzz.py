"""Fuzz: broken models fail with a QtoolError (one line; exit code 2 through the CLI), nothing else.

Seeded mutations (:mod:`fuzz_cases`) of the sample model (weights in Constant nodes), of the
same model with initializers and named nodes, of its training graph, and of small generated
MLPs, run through reading, ``rewrite_eval`` without data, ``rewrite_train`` and calibration on
two samples. A model that is accepted must give a result that can be written.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from fuzz_cases import mlp, mutate, with_initializers
from model_files import SAMPLE_CALIB, SAMPLE_MODEL

from qtool.api import calibrate, rewrite_eval, rewrite_train
from qtool.cli import main
from qtool.errors import QtoolError
from qtool.model.io import load_model

CASES = 300
SEED = 14


def calibration_data(proto: onnx.ModelProto, rng: np.random.Generator):
    """Two samples for each float input of ``proto`` (dynamic dimensions as 1)."""
    data = {}
    for value in proto.graph.input:
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in value.type.tensor_type.shape.dim]
        data[value.name] = rng.standard_normal([2] + dims[1:]).astype(np.float32)
    return data


def expect_qtool_error(fn, where: str, failures: list) -> bool:
    """Run ``fn``; True if it succeeded. A QtoolError of more than one line, or any other
    exception, is recorded in ``failures``."""
    try:
        fn()
        return True
    except QtoolError as exc:
        if "\n" in str(exc):
            failures.append(f"{where}: a QtoolError of several lines: {exc!r}")
        return False
    except Exception as exc:  # noqa: BLE001 - what the test is looking for
        failures.append(f"{where}: {type(exc).__name__}: {str(exc)[:300]}")
        return False


# a NaN cast to int32 is a silently wrong value, not an error: numpy's "invalid value" warning fails the test
# (the bias widening divided by a zero input scale and wrote a NaN bias as INT32_MIN)
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_fuzzed_models_fail_only_with_qtool_errors(tmp_path):
    rng = np.random.default_rng(SEED)
    sample = onnx.load(SAMPLE_MODEL)
    train = ir.serde.serialize_model(rewrite_train(str(SAMPLE_MODEL)).model)
    contract = {p.key: p.value for p in train.metadata_props}["qtool.training"]
    bases = {"sample": sample, "initializers": with_initializers(sample), "training graph": train}
    sample_calib = {k: v[:2] for k, v in np.load(SAMPLE_CALIB).items()}
    failures: list[str] = []
    outcomes = collections.Counter()
    refused_files = []
    path = tmp_path / "case.onnx"
    for case in range(CASES):
        which = rng.choice(["mlp", "mlp", "sample", "initializers", "training graph"])
        base = mlp(rng) if which == "mlp" else bases[which]
        kind, data = mutate(base, rng, contract)
        path.write_bytes(data)
        where = f"case {case} ({kind} of the {which} model)"
        if not expect_qtool_error(lambda: load_model(path), f"{where}, load", failures):
            outcomes["refused when read"] += 1
            if len(refused_files) < 8:
                refused_files.append((tmp_path / f"refused{case}.onnx", data))
            continue
        outcomes["read"] += 1
        expect_qtool_error(lambda: ir.serde.serialize_model(rewrite_eval(str(path)).model), f"{where}, rewrite_eval",
                           failures)
        if which == "mlp" or case % 2:
            expect_qtool_error(lambda: ir.serde.serialize_model(rewrite_train(str(path)).model),
                               f"{where}, rewrite_train", failures)
        if case % 4 == 0 and which != "training graph":
            feeds = sample_calib if which != "mlp" else calibration_data(base, rng)
            if expect_qtool_error(lambda: calibrate(str(path), feeds), f"{where}, calibrate", failures):
                outcomes["calibrated"] += 1
    assert not failures, "\n".join(failures)
    # the mutations are not all caught at the door, nor all harmless
    assert outcomes["refused when read"] > CASES // 4 and outcomes["read"] > CASES // 4, outcomes
    assert outcomes["calibrated"] > 5, outcomes
    # through the CLI: exit code 2 and one line
    from click.testing import CliRunner

    for refused, data in refused_files:
        refused.write_bytes(data)
        result = CliRunner().invoke(main, ["rewrite-eval", str(refused), "-o", str(tmp_path / "out.onnx")])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("qtool: error: "), result.stderr
        assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("seed", range(3))
def test_truncated_files_are_refused_clearly(tmp_path, seed):
    data = SAMPLE_MODEL.read_bytes()
    rng = np.random.default_rng(seed)
    for cut in sorted(rng.integers(1, len(data), size=20)):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(QtoolError) as info:
            load_model(path)
        assert "\n" not in str(info.value)
