"""The exact runtime: exact mode served by a process of its own per replica.

API processes parse and admit ``/embed`` requests; exact ones are sent to the replica's exact
runtime, one supervised process (``supervisor``) that holds the exact models mapped from their
bundles (``models``), queues the requests of every API process and merges concurrent ones into
batches (``batching``), and computes them (``process``). API processes talk to it over a Unix
socket (``wire``; large rows through shared memory, ``segments``) with ``client``, behind
``frontend``, which speaks the service's domain errors. The decision and its figures:
docs/decisions/0028-exact-runtime.md.

Nothing here imports a web framework: the runtime process starts without one.
"""
