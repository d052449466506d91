"""The data pipeline: text or token files in, fixed-length (x, y) windows out, in step order.

`launcher.data.prepare` builds (once per node) and opens the token cache;
`launcher.data.loader` turns its windows into per-rank batches; `launcher.data.shm` sizes the
shared memory the loader's workers need. The package imports none of them: only the loader
needs torch, and the front doors that size /dev/shm or a run (plan, submit) start without
it.
"""
