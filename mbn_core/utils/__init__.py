"""Numerical helpers shared by the methods (PCA, eigensolvers)."""
