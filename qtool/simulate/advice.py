"""The answer a report leads with: a verdict per model, and what to do about the layers that cost most.

Rules, stated once (they read the report dict, so a saved JSON gets the same answer):

- **verdict**: with labels, the accuracy drop in points (<= 0.5 good,
  <= 2 acceptable, else poor); without labels, the top-1 agreement with
  the float model (>= 99.5% good, >= 98% acceptable); for outputs with one
  value per sample, the output SQNR (>= 30 dB good, >= 20 dB acceptable).
- **costly layers**: with ``--sensitivity``, the layers whose single-layer
  model has the lowest output SQNR; otherwise the layers with the lowest
  SQNR among their own weight and activations.
- **what to do**, first rule that holds:
  1. more than 0.1% of the layer's activation values fall outside the
     quantizer's range -> *more calibration data*;
  2. the layer alone costs nearly all of the model's error (its
     single-layer output SQNR within 3 dB of the whole model's) ->
     *keep in float*;
  3. its weight or activation SQNR is under 30 dB (about 5 bits) -> *16 bits*
     for the worse of the two;
  4. otherwise the error is spread thin -> *fine-tune*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLIPPED_TOO_MUCH = 1e-3
DOMINANT_DB = 3.0
LOW_SQNR_DB = 30.0


@dataclass(frozen=True)
class Verdict:
    level: str  # "good", "acceptable", "poor"
    sentence: str


@dataclass(frozen=True)
class LayerAdvice:
    name: str
    op: str
    evidence: str
    action: str  # "more calibration data", "keep in float", "16 bits", "fine-tune"
    how: str


def _db(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "inf" if math.isinf(v) else f"{v:.1f}"


def _level(value: float, good: float, acceptable: float, higher_is_better: bool = True) -> str:
    if not higher_is_better:
        value, good, acceptable = -value, -good, -acceptable
    return "good" if value >= good else "acceptable" if value >= acceptable else "poor"


_MEANING = {"good": "ready to deploy: the loss is within noise",
            "acceptable": "a small loss; the layers below are where to win it back",
            "poor": "too much loss to deploy as is; start with the layers below"}


def verdict(report: dict, model: dict) -> Verdict:
    sqnr = model["output"]["sqnr_db"]
    if report.get("output_kind", "classes") != "classes":
        level = _level(sqnr if not math.isnan(sqnr) else -math.inf, LOW_SQNR_DB, 20.0)
        what = f"output SQNR {_db(sqnr)} dB (relative error {model['output'].get('relative_rms_error', math.nan):.2%})"
    elif report["labels"] and model["accuracy"] is not None:
        f_acc = report["float"]["accuracy"]
        drop = (f_acc - model["accuracy"]) * 100
        level = _level(drop, 0.5, 2.0, higher_is_better=False)
        what = (f"accuracy {model['accuracy'] * 100:.2f}% vs {f_acc * 100:.2f}% in float "
                f"({0.0 - drop:+.2f} points), output SQNR {_db(sqnr)} dB")
    else:
        level = _level(model["agreement"] * 100, 99.5, 98.0)
        per = report.get("positions", 1)
        unit = "positions" if per is None or per > 1 else "samples"
        what = f"{model['agreement'] * 100:.2f}% of {unit} keep the float model's top-1, output SQNR {_db(sqnr)} dB"
    return Verdict(level, f"{what}: {_MEANING[level]}.")


def main_model(report: dict) -> dict | None:
    """The model the summary explains: W8A8 in a what-if table, else the first."""
    models = report["models"]
    if not models:
        return None
    return next((m for m in models if m.get("weight_bits") == 8 and m.get("activation_bits") == 8), models[0])


WEIGHT_ROLES = ("weight", "W", "R")  # a layer's weight; an LSTM's input (W) and recurrence (R) weights


def _layer_facts(model: dict) -> dict[str, dict]:
    facts: dict[str, dict] = {}
    for w in model["weights"]:
        if w["role"] in WEIGHT_ROLES:  # an LSTM has two (W, R): the worse one speaks for it
            f = facts.setdefault(w["layer"], {"op": w["op"]})
            known = [v for v in (f.get("weight_sqnr"), w["sqnr_db"]) if v is not None]
            f["weight_sqnr"] = min(known) if known else None
    for a in model["activations"]:
        if a.get("layer") in facts and a["sqnr_db"] is not None:
            f = facts[a["layer"]]
            f["act_sqnr"] = min(f.get("act_sqnr", math.inf), a["sqnr_db"])
            f["clipped"] = max(f.get("clipped", 0.0), a.get("clipped_fraction") or 0.0)
    for s in model.get("sensitivity") or []:
        facts.setdefault(s["layer"], {"op": s["op"]})["alone_sqnr"] = s["sqnr_db"]
    return facts


def _advise(name: str, f: dict, model_sqnr: float) -> LayerAdvice:
    w, a, alone = f.get("weight_sqnr"), f.get("act_sqnr"), f.get("alone_sqnr")
    evidence = ", ".join(x for x in (
        f"alone it brings the output to {_db(alone)} dB" if alone is not None else "",
        f"weight SQNR {_db(w)} dB" if w is not None else "",
        f"activation SQNR {_db(a)} dB" if a is not None else "",
        f"{f['clipped']:.2%} of its activation values clipped" if f.get("clipped", 0.0) >= 1e-4 else "") if x)
    if f.get("clipped", 0.0) > CLIPPED_TOO_MUCH:
        return LayerAdvice(name, f["op"], evidence, "more calibration data",
                           "its values fall outside the calibrated range; calibrate on more (and more varied) data")
    if alone is not None and alone - model_sqnr < DOMINANT_DB:
        return LayerAdvice(name, f["op"], evidence, "keep in float",
                           f"it causes nearly all of the error; rewrite-eval --exclude '{name}'")
    worst = min((v, k) for v, k in ((w, "weights"), (a, "activations")) if v is not None) if (w, a) != (None, None) \
        else None
    if worst is not None and worst[0] < LOW_SQNR_DB:
        return LayerAdvice(name, f["op"], evidence, "16 bits",
                           f"its {worst[1]} lose the most; give them 16 bits (or keep the layer in float)")
    return LayerAdvice(name, f["op"], evidence, "fine-tune",
                       "its error is small and spread out; quantization-aware fine-tuning (rewrite-train, then "
                       "qtool finetune) recovers this kind of loss")


def costly_layers(model: dict, count: int = 3) -> list[LayerAdvice]:
    facts = _layer_facts(model)

    def cost(item):
        f = item[1]
        v = f.get("alone_sqnr") if model.get("sensitivity") else min(
            [x for x in (f.get("weight_sqnr"), f.get("act_sqnr")) if x is not None] or [math.inf])
        return math.inf if v is None or math.isnan(v) else v

    ranked = sorted(facts.items(), key=cost)[:count]
    return [_advise(name, f, model["output"]["sqnr_db"]) for name, f in ranked]
