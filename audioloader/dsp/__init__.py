"""Signal processing: pure functions on arrays, no threads, no state.

``audio`` decodes, mixes down, resamples and crops (soundfile, soxr); ``features``
computes log-mel, Kaldi fbank and waveform features for one clip or a batch;
``augment`` applies keyed augmentations; ``config`` holds the feature and length
options; ``hashing`` turns ``(seed, key)`` into the random numbers every choice uses.
"""
