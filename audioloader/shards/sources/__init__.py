"""What a source names: folders, globs, files, URLs and Iceberg snapshots resolved to sorted shard locations
(`resolve`), the sets of tars or audio files a manifest describes (`tarred_sets`), the folders ``audioloader pack``
writes (`pack_folders`), and the splits rows are read in, shared over ranks (`splits`).

Imports only ``storage/`` below it (``tests/test_layering.py``).
"""
