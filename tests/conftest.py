"""Shared test set-up: this folder is on sys.path, so tests import model_builders (small ONNX models built
the way exporters write them) wherever they live."""
