"""The start of a large job: requests, bytes, memory and seconds of a rank's metadata (manifest, listing, footers,
fingerprint, lakehouse tables) as the number of files grows, simulated and checked against a real run."""
