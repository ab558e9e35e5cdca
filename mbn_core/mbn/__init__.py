"""The Multilayer Bootstrap Network.

- ``estimator``: ``MBN``, the scikit-learn estimator: makes every random choice and
  orchestrates the layers, the "auto" choices (``auto``) and the output.
- ``bottom``, ``upper``: the layers (k-centers clusterings of the input rows, and of the
  previous layer's one-hot codes); ``_kernels`` their compiled loops, ``dtypes`` the
  narrow dtypes codes are kept in, ``encoders`` a layer's clusterings one at a time.
- ``backends``: where a layer's clusterings run (local threads, Dask), behind one interface.
- ``outputs``: how the top of the network becomes the embedding (PCA, UMAP), one strategy
  each; ``coassociation`` the similarity the UMAP output lays out.
- ``persistence``: a fitted MBN as named arrays and back; ``method``: MBN's registry entry.
"""
