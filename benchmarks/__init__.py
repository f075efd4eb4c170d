"""audioloader's benchmarks, run as modules from the repository's root: ``python -m benchmarks.<folder>.<script>``
(benchmarks/README.md says which folder holds what). Not part of the installed package."""
