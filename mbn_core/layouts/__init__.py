"""Neighbour-graph layouts from their own libraries: t-SNE (openTSNE), UMAP and densMAP
(umap-learn), PaCMAP and TriMap.

Each module wraps one library as a scikit-learn transformer (``base.LayoutMethod``): its
parameters declared once, the same input checks as every method, the library's errors named.
The libraries are optional (the ``methods`` extra, ``mbn_core.distribution.install_hint``;
umap-learn is a dependency):
importing these modules needs none of them, fitting needs the method's own.
"""

from mbn_core.layouts.base import INSTALL_LINE, LayoutMethod
from mbn_core.layouts.densmap import DensMAP
from mbn_core.layouts.pacmap import PaCMAP
from mbn_core.layouts.trimap import TriMap
from mbn_core.layouts.tsne import TSNE
from mbn_core.layouts.umap import UMAP

__all__ = ["INSTALL_LINE", "TSNE", "UMAP", "DensMAP", "LayoutMethod", "PaCMAP", "TriMap"]
