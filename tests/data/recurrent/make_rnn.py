"""A tiny recurrent tagger exported by torch the way the zoo's is, for the LSTM/GRU tests.

    /work/venv-torch/bin/python tests/data/recurrent/make_rnn.py

``torch_rnn_tagger.onnx``: x [batch, 12, 6] -> nn.LSTM(6, 8, num_layers=2, bidirectional=True,
batch_first=True) -> nn.GRU(16, 5, batch_first=True) -> nn.Linear(5, 3) per frame;
``torch.onnx.export(dynamo=False, opset_version=17)``, dynamic batch. Random weights (seeded).
``torch_rnn_tagger.npz``: ``x``, 16 samples. torch is not a qtool dependency: the files are
committed and the tests only read them.
"""

import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(16, 5, batch_first=True)
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        return self.fc(y)


def main():
    torch.manual_seed(0)
    model = Tagger().eval()
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 1, (16, 12, 6)).astype(np.float32))
    path = os.path.join(HERE, "torch_rnn_tagger.onnx")
    torch.onnx.export(model, (x[:2],), path, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    np.savez(os.path.join(HERE, "torch_rnn_tagger.npz"), x=x.numpy())
    print(path, os.path.getsize(path))


if __name__ == "__main__":
    main()
