"""What is inside a shard file: formats told apart by content and their metadata scanned (`scan`), schemas
(`schema`), the handles that read a unit of each format (`readers`), WebDataset tars and plain audio files
(`tar_format`), row filters (`filters`) and the shard writer (`writer`).

Imports only ``sources/`` and ``storage/`` below it (``tests/test_layering.py``).
"""
