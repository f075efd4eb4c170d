"""Object storage: training from S3-compatible storage against local disk, the peers over the same store, the cache
of remote shards, and the mechanisms that hide a request's latency."""
