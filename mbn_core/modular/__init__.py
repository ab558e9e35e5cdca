"""Modular kernel PCA: the estimator, its kernel maps, optimiser and ONNX export."""
