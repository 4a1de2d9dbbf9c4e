"""Build two decoder-only language models at their real sizes, for ``docs/deploy.md`` (session 13).

Needs torch (the same venv as ``make_zoo.py``; torch is never a dependency of qtool or its tests):

    /work/venv-torch/bin/python benchmarks/zoo/make_decoders.py --arch llama --out /tmp/llama
    /work/venv-torch/bin/python benchmarks/zoo/make_decoders.py --arch gpt2 --out /tmp/gpt2

then, for each of ``decode.onnx`` and ``prefill.onnx`` in ``--out`` (and their ``*.calib.npz`` / ``*.one.npz``):

    qtool rewrite-eval decode.onnx -o decode.q.onnx --data decode.calib.npz

and time float against qtool's output and onnxruntime's ``quantize_static`` in one process, interleaved
(``benchmarks/deploy.py``'s ``median_seconds``).

- ``gpt2``: GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary 50,257, LM head tied to the embedding) as
  transformers' GPT2LMHeadModel computes it: fused qkv Linear, tanh GELU, learned positions;
- ``llama``: SmolLM-135M's shape (30 layers, 576 wide, 9 query and 3 key/value heads, SwiGLU 1536, vocabulary
  49,152, tied head) as LlamaForCausalLM computes it: RMSNorm written out, rotary embeddings with ``rotate_half``,
  grouped-query attention by ``repeat_interleave``, an additive mask input.

Weights are random (N(0, 0.02)): these models measure speed and where the integer kernels run, not a task. Each is
exported with the TorchScript exporter (``dynamo=False``), opset 17, dynamic batch and lengths, as a decoding step
with a key/value cache (``past_i`` inputs, ``present_i`` outputs, 64 cached tokens at export) and as a prefill of
128 tokens without one. The decoding step's calibration caches are what the float prefill model computes for
random prompts (so the cached keys and values have the model's own statistics), written by ``--data-only`` with the
package's venv (onnxruntime) after the export.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

PAST, PROMPT = 64, 128


def build(arch: str):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if arch == "gpt2":
        layers, width, heads, kv_heads, hidden, vocab = 12, 768, 12, 12, 3072, 50257
    else:
        layers, width, heads, kv_heads, hidden, vocab = 30, 576, 9, 3, 1536, 49152
    d = width // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

    def rotate_half(x):
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            norm = (lambda: nn.LayerNorm(width)) if arch == "gpt2" else RMSNorm
            self.n1, self.n2 = norm(), norm()
            if arch == "gpt2":
                self.qkv = nn.Linear(width, 3 * width)
                self.fc, self.proj = nn.Linear(width, hidden), nn.Linear(hidden, width)
            else:
                self.q = nn.Linear(width, heads * d, bias=False)
                self.k = nn.Linear(width, kv_heads * d, bias=False)
                self.v = nn.Linear(width, kv_heads * d, bias=False)
                self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
                self.down = nn.Linear(hidden, width, bias=False)
            self.o = nn.Linear(width, width, bias=arch == "gpt2")

        def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
            b, t, _ = x.shape
            h = self.n1(x)
            if arch == "gpt2":
                q, k, v = self.qkv(h).split(width, dim=2)
            else:
                q, k, v = self.q(h), self.k(h), self.v(h)
            q = q.view(b, t, heads, d).transpose(1, 2)
            k = k.view(b, t, kv_heads, d).transpose(1, 2)
            v = v.view(b, t, kv_heads, d).transpose(1, 2)
            if arch == "llama":
                q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if past_k is not None:
                k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
            kr, vr = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
            scores = (q @ kr.transpose(-1, -2)) / math.sqrt(d) + mask
            x = x + self.o((scores.softmax(-1) @ vr).transpose(1, 2).reshape(b, t, width))
            h = self.n2(x)
            if arch == "gpt2":
                return x + self.proj(F.gelu(self.fc(h), approximate="tanh")), k, v
            return x + self.down(F.silu(self.gate(h)) * self.up(h)), k, v

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(1024, width) if arch == "gpt2" else None
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width) if arch == "gpt2" else RMSNorm()
            self.register_buffer("inv", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))

        def forward(self, ids, pos, mask, *past):
            x = self.emb(ids)
            cos = sin = None
            if arch == "gpt2":
                x = x + self.pos(pos)
            else:
                f = pos[..., None].float() * self.inv
                emb = torch.cat([f, f], -1)[:, None]
                cos, sin = emb.cos(), emb.sin()
            presents = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, cos, sin, mask, *(past[2 * i:2 * i + 2] if past else ()))
                presents += [k, v]
            return (self.norm(x) @ self.emb.weight.t(), *presents)

    model = Decoder().eval()
    for p in model.parameters():
        if p.dim() > 1:
            p.data.normal_(0, 0.02)
    return model, layers, kv_heads, d, vocab


def export(arch: str, out: str) -> None:
    import torch

    model, layers, kv_heads, d, vocab = build(arch)
    names = [f"past_{i}" for i in range(2 * layers)]
    outputs = ["logits"] + [f"present_{i}" for i in range(2 * layers)]
    ids, pos = torch.randint(0, vocab, (1, 1)), torch.tensor([[PAST]])
    past = [torch.randn(1, kv_heads, PAST, d) for _ in names]
    dyn = {"ids": {0: "batch"}, "pos": {0: "batch"}, "mask": {0: "batch", 3: "total"},
           **{n: {0: "batch", 2: "past"} for n in names}}
    torch.onnx.export(model, (ids, pos, torch.zeros(1, 1, 1, PAST + 1), *past), os.path.join(out, "decode.onnx"),
                      input_names=["ids", "pos", "mask"] + names, output_names=outputs, dynamic_axes=dyn,
                      opset_version=17, dynamo=False)
    t = PROMPT
    mask = torch.triu(torch.full((t, t), -1e4), 1)[None, None]
    dyn = {"ids": {0: "batch", 1: "t"}, "pos": {0: "batch", 1: "t"}, "mask": {0: "batch", 2: "t", 3: "t"}}
    torch.onnx.export(model, (torch.randint(0, vocab, (1, t)), torch.arange(t)[None], mask),
                      os.path.join(out, "prefill.onnx"), input_names=["ids", "pos", "mask"], output_names=outputs,
                      dynamic_axes=dyn, opset_version=17, dynamo=False)


def write_data(out: str, decode_samples: int = 12, prefill_samples: int = 8) -> None:
    """Calibration data: prompts for the prefill; for the decoding step, the caches the float prefill computes."""
    import numpy as np
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    session = ort.InferenceSession(os.path.join(out, "prefill.onnx"), providers=["CPUExecutionProvider"])
    vocab = session.get_outputs()[0].shape[-1]  # the logits' last axis is static
    causal = lambda t: np.triu(np.full((t, t), -1e4, np.float32), 1)[None, None]  # noqa: E731
    steps: dict[str, list] = {}
    for _ in range(decode_samples):
        ids = rng.integers(0, vocab, (1, PAST + 1)).astype(np.int64)
        outs = session.run(None, {"ids": ids[:, :PAST], "pos": np.arange(PAST)[None].astype(np.int64),
                                  "mask": causal(PAST)})
        feed = {"ids": ids[:, PAST:], "pos": np.array([[PAST]], np.int64),
                "mask": np.zeros((1, 1, 1, PAST + 1), np.float32),
                **{f"past_{i}": o for i, o in enumerate(outs[1:])}}
        for k, v in feed.items():
            steps.setdefault(k, []).append(v)
    decode = {k: np.concatenate(v) for k, v in steps.items()}
    prefill = {"ids": rng.integers(0, vocab, (prefill_samples, PROMPT)).astype(np.int64),
               "pos": np.tile(np.arange(PROMPT), (prefill_samples, 1)).astype(np.int64),
               "mask": np.repeat(causal(PROMPT), prefill_samples, 0)}
    for name, data in (("decode", decode), ("prefill", prefill)):
        np.savez(os.path.join(out, f"{name}.calib.npz"), **data)
        np.savez(os.path.join(out, f"{name}.one.npz"), **{k: v[:1] for k, v in data.items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-only", action="store_true", help="only write the calibration data (no torch needed)")
    ap.add_argument("--python", default=os.environ.get("QTOOL_PYTHON", "python3"),
                    help="a python with onnxruntime, for the data after the export (default: $QTOOL_PYTHON)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.data_only:
        write_data(args.out)
        return 0
    export(args.arch, args.out)
    return subprocess.call([args.python, os.path.abspath(__file__), "--arch", args.arch, "--out", args.out,
                            "--data-only"])


if __name__ == "__main__":
    sys.exit(main())
