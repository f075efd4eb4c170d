"""`ShardDataset` (`shard_dataset`), the reads of its units and rows (`unit_reads`, `row_reads`), and the rows an
augmentation mixes in (`augment_rows`): the top of ``shards/``, tying the layers below together.
"""
