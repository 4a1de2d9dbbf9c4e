"""``qtool::FakeQuant``: TensorFlow's FakeQuant as a model-local ONNX function.

The training graph (spec/rewrites.md section 5) writes fake quantization as
a node ``FakeQuant`` in domain ``qtool`` with inputs ``x``, ``min``, ``max``
and attributes ``num_bits`` (2..16) and ``narrow_range`` (0/1). The model
carries the function below, whose body uses standard ONNX ops only, so
onnxruntime (or any runtime) runs the graph unchanged. ``min``/``max``
broadcast against ``x``: scalars for one range per tensor, ``[C, 1, 1, 1]``
for per-channel Conv weights, and so on.

The body is ``kernels.md`` section 1 operation by operation, in float32
(compare ``qtool/kernels/_scalar.py``: ``nudge``, ``round_half_away``,
``fq_level_mul``, ``fq_level_div``)::

    quant_min, quant_max = narrow_range, 2**num_bits - 1     # BitShift on uint32: exact
    scale     = (max - min) / (qmaxf - qminf)
    inv_scale = (qmaxf - qminf) / (max - min)
    zp_from_min = qminf - min / scale
    zp = qminf if zp_from_min < qminf, qmaxf if > qmaxf, else round_half_away(zp_from_min)
    nudged_min = (qminf - zp) * scale;  nudged_max = (qmaxf - zp) * scale
    quant_zero = floor(-nudged_min * inv_scale + 0.5)
    clamped = max(min(x, nudged_max), nudged_min)            # std::min / std::max order
    out = floor((clamped - nudged_min) OP - quant_zero + 0.5) * scale

ONNX ``Round`` rounds half to even, so ``round_half_away`` is built from
``Floor``/``Sub``/``GreaterOrEqual``/``Where`` exactly as the scalar code
does it, and ``min``/``max`` from ``Less``/``Where`` so that a NaN input
propagates and the sign of zero is TensorFlow's.

``OP`` follows TensorFlow's two ops: a scalar (rank-0) range is
``fake_quant_with_min_max_vars``, which **divides** by ``scale``; a range
with rank >= 1 is ``fake_quant_with_min_max_vars_per_channel``, which
**multiplies** by ``inv_scale``. The last bit differs between the two on
some inputs. ``min == max == 0`` gives zeros (as the kernels do), and so does
a range too small for a normal float32 scale (``max - min < (qmaxf - qminf) *
FLT_MIN``), where TF's arithmetic overflows ``inv_scale`` and gives NaN.

Attribute ``half_to_even`` (0/1, default 0: the graphs written before it round
as TF): 1 is ``rewrite-train --round-mode half_to_even``, the level QuantizeLinear
computes on the same nudged grid, so the deployed model's activations round
exactly like the training graph's (spec/rewrites.md section 1)::

    zp = zero_point above; degenerate ranges: divisor 1 and level bounds 0
    level = Round(clamp(x / scale, qminf - zp, qmaxf - zp))  # ONNX Round: half to even; -0 as +0
    out   = level * scale

The division replaces TF's ``(clamped - nudged_min) OP - quant_zero``: that
sum is rounded on its own, and an exact tie of ``x / scale`` often is not one
after it (QuantizeLinear divides ``x`` itself). Both forms are computed and
``Where`` picks one.

``qtool::FakeQuantBias(b, scale)`` (attribute ``saturate``, 0/1) is the
deployed model's int32 bias in float: the eval graph stores a Conv/Gemm bias
as ``q = round_half_even(float32(b / scale))`` with ``scale = input_scale *
weight_scale`` (per output channel) and reads it back with a
DequantizeLinear, so the training graph adds ``q * scale`` instead of ``b``::

    q = Round(b / scale)                     # ONNX Round: half to even, as np.rint
    q = Clip(q, -2**31, 2**31)               # saturate=1: int32 saturation (8-bit kernels)
    y = q * scale
    y = b wherever any scale is 0, inf or NaN (the eval graph leaves such a bias in float)

The straight-through estimator makes its gradient the identity for ``b``
and zero for ``scale`` (``qtool.finetune.fake_quant.fake_quant_bias``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qtool.model.opset import default_opset

DOMAIN = "qtool"
NAME = "FakeQuant"
BIAS_NAME = "FakeQuantBias"
INT32_BOUND = float(np.float32(np.iinfo(np.int32).max))  # 2**31: int32's largest value as float32 rounds to it
DOMAIN_VERSION = 1
MIN_OPSET = 13  # Constant(value_int), GreaterOrEqual (12); per-channel QDQ in the eval graph (13)


def _body() -> list[onnx.NodeProto]:
    n = helper.make_node
    f = TensorProto.FLOAT

    def const_float(name, v):
        return n("Constant", [], [name], value=helper.make_tensor(name, f, [], [v]))

    nb_ref = helper.make_attribute_ref("value_int", onnx.AttributeProto.INT, ref_attr_name="num_bits")
    nr_ref = helper.make_attribute_ref("value_int", onnx.AttributeProto.INT, ref_attr_name="narrow_range")
    he_ref = helper.make_attribute_ref("value_int", onnx.AttributeProto.INT, ref_attr_name="half_to_even")
    num_bits = n("Constant", [], ["num_bits_i64"])
    num_bits.attribute.append(nb_ref)
    narrow = n("Constant", [], ["narrow_i64"])
    narrow.attribute.append(nr_ref)
    half_to_even = n("Constant", [], ["half_to_even_i64"])
    half_to_even.attribute.append(he_ref)
    return [
        # --- the grid ------------------------------------------------------------
        num_bits,
        narrow,
        half_to_even,
        n("Constant", [], ["one_u32"], value=helper.make_tensor("one_u32", TensorProto.UINT32, [], [1])),
        n("Cast", ["num_bits_i64"], ["num_bits_u32"], to=TensorProto.UINT32),
        n("BitShift", ["one_u32", "num_bits_u32"], ["levels_u32"], direction="LEFT"),
        n("Cast", ["levels_u32"], ["levels"], to=f),
        const_float("one", 1.0),
        const_float("half", 0.5),
        const_float("zero", 0.0),
        n("Sub", ["levels", "one"], ["qmaxf"]),
        n("Cast", ["narrow_i64"], ["narrow_bool"], to=TensorProto.BOOL),
        n("Cast", ["narrow_bool"], ["qminf"], to=f),
        # --- nudging (kernels.md 1.1) -----------------------------------------
        n("Sub", ["max", "min"], ["range"]),
        n("Sub", ["qmaxf", "qminf"], ["qrange"]),
        n("Div", ["range", "qrange"], ["scale_raw"]),
        n("Div", ["qrange", "range"], ["inv_scale_raw"]),
        n("Div", ["min", "scale_raw"], ["min_over_scale"]),
        n("Sub", ["qminf", "min_over_scale"], ["zp_from_min"]),
        # round_half_away(zp_from_min): r = floor(v); r + 1 if (v >= 0 ? d >= .5 : d > .5)
        n("Floor", ["zp_from_min"], ["zp_floor"]),
        n("Sub", ["zp_from_min", "zp_floor"], ["zp_frac"]),
        n("GreaterOrEqual", ["zp_from_min", "zero"], ["zp_nonneg"]),
        n("GreaterOrEqual", ["zp_frac", "half"], ["zp_up_nonneg"]),
        n("Greater", ["zp_frac", "half"], ["zp_up_neg"]),
        n("And", ["zp_nonneg", "zp_up_nonneg"], ["zp_up_if_nonneg"]),
        n("Not", ["zp_nonneg"], ["zp_neg"]),
        n("And", ["zp_neg", "zp_up_neg"], ["zp_up_if_neg"]),
        n("Or", ["zp_up_if_nonneg", "zp_up_if_neg"], ["zp_up"]),
        n("Add", ["zp_floor", "one"], ["zp_floor_plus_one"]),
        n("Where", ["zp_up", "zp_floor_plus_one", "zp_floor"], ["zp_rounded"]),
        n("Greater", ["zp_from_min", "qmaxf"], ["zp_above"]),
        n("Where", ["zp_above", "qmaxf", "zp_rounded"], ["zp_upper"]),
        n("Less", ["zp_from_min", "qminf"], ["zp_below"]),
        n("Where", ["zp_below", "qminf", "zp_upper"], ["zero_point"]),
        n("Sub", ["qminf", "zero_point"], ["qmin_minus_zp"]),
        n("Mul", ["qmin_minus_zp", "scale_raw"], ["nudged_min_raw"]),
        n("Sub", ["qmaxf", "zero_point"], ["qmax_minus_zp"]),
        n("Mul", ["qmax_minus_zp", "scale_raw"], ["nudged_max_raw"]),
        n("Neg", ["nudged_min_raw"], ["neg_nudged_min"]),
        n("Mul", ["neg_nudged_min", "inv_scale_raw"], ["qz_scaled"]),
        n("Add", ["qz_scaled", "half"], ["qz_half"]),
        n("Floor", ["qz_half"], ["quant_zero_raw"]),
        # min == max == 0: every parameter 0, the output all zeros (kernels.md 1.4)
        n("Equal", ["min", "zero"], ["min_is_zero"]),
        n("Equal", ["max", "zero"], ["max_is_zero"]),
        n("And", ["min_is_zero", "max_is_zero"], ["both_zero"]),
        # a scale that is not a normal float32 (inv_scale overflows, or denormals flush to 0): as zeros
        const_float("flt_min", float(np.finfo(np.float32).tiny)),
        n("Less", ["scale_raw", "flt_min"], ["scale_tiny"]),
        n("Or", ["both_zero", "scale_tiny"], ["degenerate"]),
        n("Where", ["degenerate", "zero", "nudged_min_raw"], ["nudged_min"]),
        n("Where", ["degenerate", "zero", "nudged_max_raw"], ["nudged_max"]),
        n("Where", ["degenerate", "zero", "scale_raw"], ["scale"]),
        n("Where", ["degenerate", "zero", "inv_scale_raw"], ["inv_scale"]),
        n("Where", ["degenerate", "zero", "quant_zero_raw"], ["quant_zero"]),
        # --- forward (kernels.md 1.2) ------------------------------------------
        n("Less", ["nudged_max", "x"], ["above"]),
        n("Where", ["above", "nudged_max", "x"], ["clamped_hi"]),  # std::min(x, nudged_max)
        n("Less", ["clamped_hi", "nudged_min"], ["below"]),
        n("Where", ["below", "nudged_min", "clamped_hi"], ["clamped"]),  # std::max(., nudged_min)
        n("Sub", ["clamped", "nudged_min"], ["shifted"]),
        # vars (rank-0 range) divides by scale; per_channel multiplies by inv_scale
        n("Shape", ["min"], ["min_shape"]),
        n("Size", ["min_shape"], ["min_rank"]),
        n("Constant", [], ["rank_zero"], value=helper.make_tensor("rank_zero", TensorProto.INT64, [], [0])),
        n("Equal", ["min_rank", "rank_zero"], ["per_tensor"]),
        n("Not", ["degenerate"], ["not_degenerate"]),
        n("And", ["per_tensor", "not_degenerate"], ["use_divide"]),
        n("Div", ["shifted", "scale_raw"], ["shifted_div"]),
        n("Mul", ["shifted", "inv_scale"], ["shifted_mul"]),
        n("Where", ["use_divide", "shifted_div", "shifted_mul"], ["scaled"]),
        n("Sub", ["scaled", "quant_zero"], ["level_raw"]),
        n("Add", ["level_raw", "half"], ["level_half"]),
        n("Floor", ["level_half"], ["level_up"]),
        # --- half_to_even: QuantizeLinear's level Round(clamp(x / scale, qmin - zp, qmax - zp)) ---------
        n("Where", ["degenerate", "one", "scale_raw"], ["divisor"]),
        n("Div", ["x", "divisor"], ["x_over_scale"]),
        n("Where", ["degenerate", "zero", "qmin_minus_zp"], ["level_min"]),
        n("Where", ["degenerate", "zero", "qmax_minus_zp"], ["level_max"]),
        n("Less", ["level_max", "x_over_scale"], ["level_above"]),
        n("Where", ["level_above", "level_max", "x_over_scale"], ["level_clamped_hi"]),
        n("Less", ["level_clamped_hi", "level_min"], ["level_below"]),
        n("Where", ["level_below", "level_min", "level_clamped_hi"], ["level_clamped"]),
        n("Round", ["level_clamped"], ["level_rounded"]),
        n("Equal", ["level_rounded", "zero"], ["level_is_zero"]),
        n("Where", ["level_is_zero", "zero", "level_rounded"], ["level_even"]),  # +0.0, as DequantizeLinear
        n("Cast", ["half_to_even_i64"], ["half_to_even_bool"], to=TensorProto.BOOL),
        n("Where", ["half_to_even_bool", "level_even", "level_up"], ["level"]),
        n("Mul", ["level", "scale"], ["y"]),
    ]


def _bias_body() -> list[onnx.NodeProto]:
    n = helper.make_node
    f = TensorProto.FLOAT

    def const_float(name, v):
        return n("Constant", [], [name], value=helper.make_tensor(name, f, [], [v]))

    sat_ref = helper.make_attribute_ref("value_int", onnx.AttributeProto.INT, ref_attr_name="saturate")
    saturate = n("Constant", [], ["saturate_i64"])
    saturate.attribute.append(sat_ref)
    return [
        saturate,
        n("Cast", ["saturate_i64"], ["saturate_bool"], to=TensorProto.BOOL),
        const_float("zero", 0.0),
        const_float("one", 1.0),
        const_float("inf", float("inf")),
        const_float("low", -INT32_BOUND),
        const_float("high", INT32_BOUND),
        n("Div", ["b", "scale"], ["levels_raw"]),
        n("Round", ["levels_raw"], ["levels"]),  # half to even, as the eval graph's np.rint
        n("Clip", ["levels", "low", "high"], ["levels_clipped"]),
        n("Where", ["saturate_bool", "levels_clipped", "levels"], ["levels_int32"]),
        n("Mul", ["levels_int32", "scale"], ["quantized"]),
        # a scale of 0, inf or NaN anywhere: the eval graph leaves the bias in float
        n("Greater", ["scale", "zero"], ["positive"]),
        n("Less", ["scale", "inf"], ["finite"]),
        n("And", ["positive", "finite"], ["usable"]),
        n("Cast", ["usable"], ["usable_f"], to=f),
        n("ReduceMin", ["usable_f"], ["all_usable_f"], keepdims=0),
        n("Equal", ["all_usable_f", "one"], ["all_usable"]),
        n("Where", ["all_usable", "quantized", "b"], ["y"]),
    ]


def bias_function_proto(opset: int) -> onnx.FunctionProto:
    """The ``qtool::FakeQuantBias`` FunctionProto, importing the standard ops at ``opset``."""
    fn = helper.make_function(
        DOMAIN,
        BIAS_NAME,
        inputs=["b", "scale"],
        outputs=["y"],
        nodes=_bias_body(),
        opset_imports=[helper.make_opsetid("", int(opset))],
        attributes=[],
        doc_string="The deployed int32 bias in float: Round(b / scale) [clipped to int32] * scale, "
        "scale = input_scale * weight_scale.",
    )
    fn.attribute_proto.append(helper.make_attribute("saturate", 1))
    return fn


def function_proto(opset: int) -> onnx.FunctionProto:
    """The ``qtool::FakeQuant`` FunctionProto, importing the standard ops at ``opset``."""
    fn = helper.make_function(
        DOMAIN,
        NAME,
        inputs=["x", "min", "max"],
        outputs=["y"],
        nodes=_body(),
        opset_imports=[helper.make_opsetid("", int(opset))],
        attributes=[],
        doc_string="TensorFlow FakeQuant (kernels.md section 1) in standard ONNX ops; "
        "scalar min/max: fake_quant_with_min_max_vars, else per_channel; half_to_even=1: QuantizeLinear's "
        "rounding on the same grid.",
    )
    for name, default in (("num_bits", 8), ("narrow_range", 0), ("half_to_even", 0)):
        fn.attribute_proto.append(helper.make_attribute(name, default))
    return fn


def fake_quant_function(opset: int):
    """The function as an ``onnx_ir.Function`` for a model at ``opset`` (>= 13)."""
    import onnx_ir as ir

    return ir.serde.deserialize_function(function_proto(opset))


def add_fake_quant_function(model) -> None:
    """Add the function (and ``qtool::FakeQuantBias`` when a node uses it) and the ``qtool`` opset
    import to an ``onnx_ir.Model``."""
    import onnx_ir as ir

    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise ValueError(f"qtool::FakeQuant needs opset >= {MIN_OPSET}, the model has {opset}")
    fn = fake_quant_function(opset)
    model.functions[fn.identifier()] = fn
    if any(n.domain == DOMAIN and n.op_type == BIAS_NAME for n in model.graph.all_nodes()):
        bias_fn = ir.serde.deserialize_function(bias_function_proto(opset))
        model.functions[bias_fn.identifier()] = bias_fn
    model.opset_imports[DOMAIN] = DOMAIN_VERSION
    model.ir_version = max(model.ir_version, 9)  # model-local functions with attribute defaults


def fake_quant_model(shape_x, shape_range, *, num_bits: int, narrow_range: bool, opset: int = MIN_OPSET,
                     half_to_even: bool = False) -> onnx.ModelProto:
    """A one-node model ``y = qtool::FakeQuant(x, min, max)`` (min/max as inputs): for tests and checks."""
    f = TensorProto.FLOAT
    node = helper.make_node(NAME, ["x", "min", "max"], ["y"], domain=DOMAIN, num_bits=int(num_bits),
                            narrow_range=int(bool(narrow_range)), half_to_even=int(bool(half_to_even)))
    graph = helper.make_graph(
        [node],
        "fake_quant",
        [
            helper.make_tensor_value_info("x", f, list(shape_x)),
            helper.make_tensor_value_info("min", f, list(shape_range)),
            helper.make_tensor_value_info("max", f, list(shape_range)),
        ],
        [helper.make_tensor_value_info("y", f, list(shape_x))],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        functions=[function_proto(opset)],
    )
    model.ir_version = 9
    return model
