"""A remote object's content identity: its ETag (or version / checksum) as the storage reports it.

S3's modification time has a resolution of one second, so a shard rewritten in the
second it was written keeps its name, size and time. The ETag does not: S3 computes
it from the content (the MD5 of a single-part upload, a hash of the parts' MD5s for
a multipart one) or gives every upload a new one (encrypted objects). Either way a
changed object has a new ETag, and the same ETag means the same bytes.

It costs no request: pyarrow's S3 filesystem answers ``open_input_file`` with a HEAD
whose headers ``metadata()`` returns, and the scan opens every remote file anyway.
"""

from __future__ import annotations

from typing import Any

# Header names, in order of preference: a version id names one exact upload; an ETag or a checksum names content.
_IDENTITY_KEYS = ("x-amz-version-id", "VersionId", "ETag", "etag", "x-goog-generation", "generation", "crc32c",
                  "md5Hash", "Content-MD5")


def object_identity(f: Any) -> str | None:
    """The content identity of an open remote file (a pyarrow ``NativeFile``), from the headers its opening
    request returned; None when the storage or the filesystem reports none (fsspec wrappers, local files)."""
    try:
        metadata = f.metadata()
    except (AttributeError, NotImplementedError, OSError):
        return None
    if not metadata:
        return None
    for key in _IDENTITY_KEYS:
        value = metadata.get(key)
        if value:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            return f"{key}:{text.strip()}"
    return None
