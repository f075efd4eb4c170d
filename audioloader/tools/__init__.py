"""The command line and what it runs: ``pack``, ``inspect``, ``demo``, ``bench``, and synthetic data."""
