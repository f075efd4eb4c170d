"""One stage or mechanism of the chain, in this process: reader, shuffle, decode, augment, the worker hand-off, the
checks on the hot path, the state kept per batch."""
