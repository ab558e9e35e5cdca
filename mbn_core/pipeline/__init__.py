"""The training pipeline: parameters, the held-out report, and the bundle it writes."""
