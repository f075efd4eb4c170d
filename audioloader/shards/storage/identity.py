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

import hashlib
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


def identities_differ(expected: str | None, found: str | None) -> bool:
    """Whether two identities (`object_identity`'s ``"kind:value"``) name different objects: both known, of one kind
    (an ETag against an ETag...), and different values (an ETag's quotes aside: clients differ in keeping them)."""
    if expected is None or found is None:
        return False
    kind, _, value = expected.partition(":")
    found_kind, _, found_value = found.partition(":")
    return kind.lower() == found_kind.lower() and value.strip().strip('"') != found_value.strip().strip('"')


# -- the same bytes under another ETag ----------------------------------------------------------------------------

#: Part sizes tried for a multipart ETag are multiples of this (S3 clients pick MiB: pyarrow 10 MiB, boto3 and the
#: AWS CLI 8 MiB, ...), at most this many of them (the ETag's part count leaves a range of sizes).
_PART_SIZE_STEP = 1 << 20
_MAX_PART_SIZES = 64


def md5_etag(identity: str | None) -> tuple[str, int] | None:
    """``(md5 hex, parts)`` of an S3 ETag identity (``'ETag:"<md5>"'``: one PUT, parts 0; ``'ETag:"<md5>-N"'``:
    a multipart upload of N parts), or None for anything else (a version id, an encrypted object's ETag...)."""
    if identity is None or not identity.lower().startswith("etag:"):
        return None
    text = identity.split(":", 1)[1].strip().strip('"').lower()
    digest, _, parts = text.partition("-")
    if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest) or (parts and not parts.isdigit()):
        return None
    return digest, int(parts) if parts else 0


def etag_part_sizes(size: int, parts: int) -> list[int]:
    """The part sizes (multiples of `_PART_SIZE_STEP`) a multipart upload of ``size`` bytes in ``parts`` parts
    may have used: every part but the last is full, so ``(parts - 1) * p < size <= parts * p``."""
    if parts <= 1:
        return [max(size, 1)]
    low, high = -(-size // parts), -(-size // (parts - 1)) - 1
    first = -(-low // _PART_SIZE_STEP) * _PART_SIZE_STEP
    return list(range(first, high + 1, _PART_SIZE_STEP))[:_MAX_PART_SIZES]


class ETagCheck:
    """Whether bytes fed in order (`update`) are the content an S3 ETag was computed from (`matches`).

    S3's ETag of an unencrypted object is a content checksum: the MD5 of the bytes for one PUT,
    the MD5 of the parts' MD5s (and ``-N``) for a multipart upload. So the same bytes uploaded
    another way have another ETag; fed those bytes, this check still says they are the same.
    """

    def __init__(self, identity: str, size: int) -> None:
        parsed = md5_etag(identity)
        if parsed is None:
            raise ValueError(f"{identity!r} is not an MD5-based S3 ETag")
        self.digest, self.parts = parsed
        self._whole = hashlib.md5(usedforsecurity=False)
        # Per candidate part size: the finished parts' digests, the open part's hash and its bytes so far.
        self._split = {p: ([], hashlib.md5(usedforsecurity=False), 0)
                       for p in (etag_part_sizes(size, self.parts) if self.parts else [])}

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        if not self.parts:
            self._whole.update(view)
            return
        for part_size, (done, current, filled) in list(self._split.items()):
            pos = 0
            while pos < len(view):
                take = min(part_size - filled, len(view) - pos)
                current.update(view[pos:pos + take])
                pos, filled = pos + take, filled + take
                if filled == part_size:
                    done.append(current.digest())
                    current, filled = hashlib.md5(usedforsecurity=False), 0
            self._split[part_size] = (done, current, filled)

    def matches(self) -> bool:
        if not self.parts:
            return self._whole.hexdigest() == self.digest
        for done, current, filled in self._split.values():
            digests = done + ([current.digest()] if filled else [])
            if len(digests) == self.parts and hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() \
                    == self.digest:
                return True
        return False
