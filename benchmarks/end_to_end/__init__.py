"""The whole loader as a user runs it, each contender in a fresh process: training loops against DataLoader, Lhotse
and the limit; scaling with cores; peak memory; Ctrl-C."""
