"""`RemoteReads`: how remote shards are read (read-ahead budget, requests in flight, the metadata index)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import checks
from .readahead import DEFAULT_READAHEAD_BYTES
from .remote import DEFAULT_MAX_REQUESTS

INDEX_MODES = ("auto", "off")


@dataclass(frozen=True)
class RemoteReads:
    """How remote shards (``s3://``, ``gs://``, any ``filesystem=``) are read; local files are memory-mapped and
    ignore it. The loader's `audioloader.Storage` carries the same fields. See docs/storage.md ("Read-ahead",
    "The metadata index").

    Attributes:
        readahead_bytes: bytes of upcoming record batches / row groups a reader fetches ahead
            and holds, at most (0: no read-ahead). Size it to bandwidth x latency x a few:
            at 100 MB/s and 50 ms a request, 5 MB are in flight at any time; the 64 MiB
            default also rides out slow requests and covers ``Shuffle(interleave=k)``'s k splits.
        max_requests: requests in flight at once per dataset (construction, read-ahead,
            random access).
        index: ``"auto"``: start from the folder's dataset manifest (``_audioloader_manifest.arrow``,
            written by ``audioloader pack`` / ``audioloader index``) when there is one, else from a 0.3
            metadata index (``_audioloader_index.arrow``) while it matches the listing, else scan the
            files; ``"off"``: ignore both and always scan.
    """

    readahead_bytes: int = DEFAULT_READAHEAD_BYTES
    max_requests: int = DEFAULT_MAX_REQUESTS
    index: str = "auto"

    def __post_init__(self) -> None:
        for name, minimum in (("readahead_bytes", 0), ("max_requests", 1)):
            checks.count(f"Storage.{name}", getattr(self, name), minimum=minimum)
        if self.index not in INDEX_MODES:
            raise ValueError(f"Storage.index={self.index!r}: must be one of {INDEX_MODES}")


DEFAULT_REMOTE_READS = RemoteReads()
