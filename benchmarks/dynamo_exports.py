"""Real architectures at real sizes, exported by torch's default (dynamo) exporter, for ``dynamo_deploy.py``.

    /work/venv-torch/bin/python benchmarks/dynamo_exports.py OUT_DIR [--models bert,vit] [--samples 32]

Each model is built with HF ``transformers`` from its default-sized config with random weights
(seeded; no download: the configs are written here, not fetched), exported with
``torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=...)`` at the default opset, as a
user would (dynamic batch; dynamic sequence for the text models), and written as ``OUT_DIR/<name>.onnx``
with ``<name>.calib.npz`` (calibration inputs: ``--samples`` random-normal images / uniform token ids
with a full attention mask / random-normal log-mel features) and ``<name>.json`` (input names and the
batch-1 feed shapes). Batch norms get random running statistics so that torch's folding is not a no-op.

torch and transformers are NOT qtool dependencies; the models are not committed (tens to hundreds of MB).
Needs torch 2.9+ (dynamo is the default exporter), onnxscript and transformers (pure Python).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

# benchmarks/kernels.py would shadow the `kernels` package that transformers probes for: not on the path
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

SEQ = 128  # text models: sequence length of the calibration and timing inputs
SEED = 0


def _randomize_norms(model):
    import torch

    g = torch.Generator().manual_seed(SEED)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 0.5 + 0.75)


def _wrap(model, key):
    """The HF model as export sees it: tensors in, one tensor out (``last_hidden_state`` or ``logits``)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            out = self.m(*args, return_dict=True)
            return out[key]

    return Wrapped(model).eval()


def _image(cls_name, cfg_name, size, key="logits", **cfg):
    def build():
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config)
        return _wrap(model, key), {"pixel_values": (3, size, size)}
    return build


def _text(cls_name, cfg_name, key="last_hidden_state", mask=True, **cfg):
    def build():
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config)
        feeds = {"input_ids": ("ids", config.vocab_size)}
        if mask:
            feeds["attention_mask"] = ("mask",)
        return _wrap(model, key), feeds
    return build


def _whisper():
    import torch
    import transformers

    config = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                                        decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                                        num_mel_bins=80)
    enc = transformers.WhisperModel(config).get_encoder()

    class Enc(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return self.m(*args, return_dict=True).last_hidden_state

    return Enc(enc).eval(), {"input_features": (80, 3000)}


def _t5():
    import transformers

    config = transformers.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64, vocab_size=32128)
    enc = transformers.T5EncoderModel(config)
    return _wrap(enc, "last_hidden_state"), {"input_ids": ("ids", 32128), "attention_mask": ("mask",)}


MODELS = {
    # text: BERT-base (dynamic batch and sequence), DistilBERT, T5-small encoder
    "bert": _text("BertModel", "BertConfig"),
    "distilbert": _text("DistilBertModel", "DistilBertConfig"),
    "t5enc": _t5,
    # vision transformers
    "vit": _image("ViTForImageClassification", "ViTConfig", 224),
    "swin": _image("SwinForImageClassification", "SwinConfig", 224),  # swin-tiny: the default config
    "mobilevit": _image("MobileViTForImageClassification", "MobileViTConfig", 256),  # small: the default
    "segformer": _image("SegformerForSemanticSegmentation", "SegformerConfig", 512),  # b0: the default
    # CNNs
    "convnext": _image("ConvNextForImageClassification", "ConvNextConfig", 224),  # tiny: the default
    "resnet50": _image("ResNetForImageClassification", "ResNetConfig", 224),  # ResNet-50: the default
    "efficientnet": _image("EfficientNetForImageClassification", "EfficientNetConfig", 224),  # B0: the default
    "mobilenetv2": _image("MobileNetV2ForImageClassification", "MobileNetV2Config", 224),
    # audio
    "whisperenc": _whisper,
}


def calib_inputs(spec: dict, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in spec.items():
        if shape[0] == "ids":
            out[name] = rng.integers(1000, shape[1], size=(n, SEQ)).astype(np.int64)
        elif shape[0] == "mask":
            out[name] = np.ones((n, SEQ), np.int64)
        else:
            out[name] = rng.standard_normal((n, *shape)).astype(np.float32)
    return out


def export(name: str, out_dir: str, samples: int) -> None:
    import torch

    torch.manual_seed(SEED)
    model, spec = MODELS[name]()
    _randomize_norms(model)
    model.eval()
    rng = np.random.default_rng(SEED)
    calib = calib_inputs(spec, samples, rng)
    args = tuple(torch.from_numpy(v[:2]) for v in calib.values())
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("seq", min=2, max=512)
    dyn = {k: ({0: batch, 1: seq} if isinstance(s[0], str) else {0: batch}) for k, s in spec.items()}
    path = os.path.join(out_dir, name + ".onnx")
    t = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=(tuple(dyn.values()),),  # forward(*args)
                          input_names=list(spec), output_names=["output"])
    np.savez(os.path.join(out_dir, name + ".calib.npz"), **calib)
    json.dump({"inputs": list(spec), "shapes": {k: list(v.shape[1:]) for k, v in calib.items()}},
              open(os.path.join(out_dir, name + ".json"), "w"))
    print(f"{name:14s} opset {exported_opset(path)} {os.path.getsize(path) / 1e6:7.1f} MB  {time.perf_counter() - t:5.1f} s",
          flush=True)


def exported_opset(path: str) -> list[int]:
    """The standard opset versions an exported file imports (its weights not read)."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    return [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--samples", type=int, default=32)
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for name in args.models.split(","):
        try:
            export(name, args.out_dir, args.samples)
        except Exception as e:  # one failing export is a result, not the end of the run
            lines = [ln for ln in str(e).splitlines() if ln.startswith("<class")] or str(e).splitlines()[:1]
            print(f"{name:14s} FAILED: {type(e).__name__}: {lines[0][:400]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
