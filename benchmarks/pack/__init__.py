"""``audioloader pack``: throughput of writing shards from audio files."""
