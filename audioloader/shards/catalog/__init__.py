"""What a start reads instead of every file: the dataset manifest (`manifest`; a folder read through it:
`manifest_source`), the metadata index (`index`), and every file's and split's metadata as columns
(`file_table`).

Imports only ``formats/``, ``sources/`` and ``storage/`` below it (``tests/test_layering.py``).
"""
