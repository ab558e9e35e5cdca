"""The Multilayer Bootstrap Network: its estimator, layers, kernels and outputs."""
