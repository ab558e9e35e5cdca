"""Where an MBN layer's clusterings run: local threads, a Dask cluster."""
