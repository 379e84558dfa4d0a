"""A shim for biopb-tensor-server 0.13.0's remote Zarr path (benches/objstore.py only).

Its `remote_zarr_store` hands zarr 3 an s3fs filesystem made for synchronous use, whose
aiohttp session lives on fsspec's event loop, while zarr runs its own loop: every read
then fails with "... attached to a different loop". Loaded as `sitecustomize` (this folder
on PYTHONPATH), this makes zarr's synchronous API run on fsspec's loop, so the server's
own code reads the store unchanged.
"""
try:
    import fsspec.asyn
    import zarr.core.sync

    zarr.core.sync.loop[0] = fsspec.asyn.get_loop()
    zarr.core.sync.iothread[0] = fsspec.asyn.iothread[0]
except ImportError:  # not the reference venv
    pass
