"""The bytes of shard files, local or remote: where a file lives and the one rule for URLs (`locations`), ranged
reads (`remote`, `direct`), retried (`retry`) at the rate a store accepts (`throttle`), an object's identity
(`identity`), the byte ranges of units (`units`), read-ahead (`readahead`), the machine's caches (`cache`,
`machine_cache`), local files that change (`changes`) and the `Storage` option group (`options`).

The lowest layer of ``shards/``: it imports no other part of it (``tests/test_layering.py``).
"""
