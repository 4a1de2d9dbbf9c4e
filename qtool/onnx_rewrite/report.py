"""The rewrite summary as text for the terminal (``--json`` prints the dict itself)."""

from __future__ import annotations


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}" + ("es" if word.endswith(("s", "ch")) else "s")


def format_summary(s: dict) -> str:
    c = s["counts"]
    o = s["options"]
    lines = []
    target = s["output"] or "(not written)"
    lines.append(f"qtool rewrite-eval: {s['input']} -> {target}")
    if s["opset"]["input"] != s["opset"]["output"]:
        lines.append(f"  opset                  {s['opset']['input']} -> {s['opset']['output']}")
    folded = c["batch_norms_folded"]
    total_bn = folded + c["batch_norms_not_folded"]
    lines.append(f"  batch norms folded     {folded} of {total_bn}")
    mode = "per-channel" if o["per_channel"] else "per-tensor"
    sym = ", symmetric" if o["symmetric"] else ""
    lines.append(
        f"  layers quantized       {c['layers_quantized']}  "
        f"({_plural(c['weights_quantized'], 'weight tensor')}, {o['weight_bits']}-bit {mode}{sym})"
    )
    calib = s.get("calibration")
    if calib:
        where = f"calibrated: {calib['samples']} samples, {_plural(calib['batches'], 'batch')}, {calib['method']}"
    elif s.get("ranges_from"):
        where = f"ranges from {s['ranges_from']}"
    elif c["activations_quantized"]:
        where = "TensorFlow's default ranges: NOT CALIBRATED"
    else:
        where = "none new"
    lines.append(f"  activations quantized  {c['activations_quantized']}  ({o['activation_bits']}-bit, {where})")
    extra = []
    if c["propagated_input_quantizers"]:
        extra.append(_plural(c["propagated_input_quantizers"], "propagated input quantizer"))
    if c["biases_int32"]:
        extra.append(_plural(c["biases_int32"], "int32 bias"))
    if extra:
        lines.append(f"  for onnxruntime        {', '.join(extra)}")
    if c["already_quantized_weights"] or c["already_quantized_activations"]:
        lines.append(
            f"  already quantized      {c['already_quantized_weights']} weights, "
            f"{c['already_quantized_activations']} activations (left as they are)"
        )
    left = s["left_in_float"]
    if left:
        lines.append(f"  left in float          {len(left)}")
        width = max(len(f"{x['node']} ({x['op']})") for x in left)
        for x in left:
            label = f"{x['node']} ({x['op']})"
            lines.append(f"    {label:<{width}}  {x['reason']}")
    if s["other_float_ops"]:
        ops = ", ".join(f"{op} x{n}" for op, n in s["other_float_ops"].items())
        lines.append(f"  other ops (no rule)    {ops}")
    if s.get("external_data"):
        lines.append(f"  external data          {s['external_data']}")
    for note in s["notes"]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
