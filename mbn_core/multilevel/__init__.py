"""Multilevel manifold learning: coarsening, the coarse embedding, refinement."""
