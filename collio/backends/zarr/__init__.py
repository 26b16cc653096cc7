"""The zarr backend: a zarr array (v3, sharded or not) where each chunk or shard has one writer.

``collio.open(path_or_store_or_array, mode, backend="zarr", **options)``; the backend
class is :class:`collio.backends.zarr.backend.ZarrBackend`, imported (with zarr) only
when used.  :mod:`.spec` opens and creates arrays on one rank, :mod:`.regions` moves
many regions at once on zarr's event loop, :mod:`.shares` decides which units ranks
keep (pure).
"""
