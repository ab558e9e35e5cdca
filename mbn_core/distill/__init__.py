"""Distillation: the compressive student of a fitted method and its ONNX graph."""
