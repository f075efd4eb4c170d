"""Ranged reads without a HEAD: S3 objects read through obstore (optional), whose GET response carries the object's
ETag and size.

pyarrow's S3 filesystem opens every object with a HEAD before its first ranged GET
(``open_input_file``; its C++ ``OpenInputFile(FileInfo)`` skips it, but no Python call
reaches that: ``pyarrow.dataset``'s ``FileFragment.open()`` with ``file_size=`` still sends
the HEAD, measured with pyarrow 26). A start without a manifest then costs two requests a file.
obstore's ``get`` with a range is one request, and its response says the object's ETag and
size, so a file's identity is checked on its first read at no extra cost; later reads send
``If-Match`` with that ETag, so a file rewritten mid-read is refused by the store (HTTP 412),
never mixed.

It is used only where it reads with the credentials pyarrow would use, and the rest of the
store's settings are pyarrow's (endpoint, region, scheme): an S3 filesystem with keys on
the URL or the filesystem, anonymous access, or the ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) variables, which both read. Anything else
(profiles, roles, proxies, a custom CA) stays with pyarrow. ``AUDIOLOADER_DIRECT_READS=0`` turns it off.
Install it with ``pip install obstore`` (the ``[s3]`` extra).
"""

from __future__ import annotations

import datetime
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ...errors import ShardChangedError


@dataclass(frozen=True)
class Response:
    """A ranged read's bytes and what the response said about the object: its identity (as
    `identity.object_identity` writes it) and size in bytes (None where not said)."""

    data: pa.Buffer
    identity: str | None
    size: int | None


def store_for(fs: Any) -> Any:
    """An obstore S3 store over the same bucket-less endpoint as the pyarrow S3 filesystem ``fs``, or None where
    direct reads do not apply (see the module docstring). The bucket is chosen per read."""
    if os.environ.get("AUDIOLOADER_DIRECT_READS", "1") == "0" or not isinstance(fs, pafs.S3FileSystem):
        return None
    try:
        import obstore  # noqa: F401  (optional)
    except ImportError:
        return None
    options = fs.__reduce__()[1][0]
    proxy = options.get("proxy_options") or {}
    if options.get("role_arn") or proxy.get("host") or options.get("tls_ca_file_path"):
        return None
    explicit = options.get("access_key") is not None
    if not (explicit or options.get("anonymous") or os.environ.get("AWS_ACCESS_KEY_ID")):
        return None
    config: dict[str, Any] = {}
    if options.get("region"):
        config["region"] = options["region"]
    endpoint = options.get("endpoint_override")
    scheme = options.get("scheme") or "https"
    if endpoint:  # "host:port", or a URL (from AWS_ENDPOINT_URL): its scheme wins
        config["endpoint"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
        scheme = config["endpoint"].split("://", 1)[0]
    if explicit:
        config.update(access_key_id=options["access_key"], secret_access_key=options["secret_key"])
        if options.get("session_token"):
            config["token"] = options["session_token"]
    if options.get("anonymous"):
        config["skip_signature"] = True
    if options.get("force_virtual_addressing"):
        config["virtual_hosted_style_request"] = True
    timeout = options.get("request_timeout")
    client = {"allow_http": scheme == "http"}
    if timeout and timeout > 0:
        client["timeout"] = f"{timeout}s"
        client["connect_timeout"] = f"{timeout}s"
    return _Stores(config, client)


class DirectStores:
    """`store_for` of each filesystem seen, made once (thread-safe). A filesystem is kept with its stores, so its
    ``id`` stays its own while it is asked about."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[int, tuple[Any, Any]] = {}

    def of(self, loc: Any) -> Any:
        """The obstore stores reading the remote file ``loc`` (a `locations.Location`) without a HEAD, or None (a
        local file, a size not known from a listing or manifest, or a filesystem `store_for` leaves to pyarrow)."""
        if loc.fs is None or loc.size is None:  # its size unknown (not listed): pyarrow's open asks for it
            return None
        key = id(loc.fs)
        with self._lock:
            if key not in self._stores:
                self._stores[key] = (loc.fs, store_for(loc.fs))
            return self._stores[key][1]


def size_changed(loc: Any, size: int) -> ShardChangedError:
    """The error for a remote file the store now says has ``size`` bytes, not the ``loc.size`` its listing (or the
    dataset's manifest) said."""
    return ShardChangedError(f"shard {loc.path} has {size:,} bytes now, {loc.size:,} when it was listed (or written "
                             "into the dataset's manifest): it changed; build the loader again (after `audioloader "
                             "index FOLDER` where the folder has a manifest)")


class _Stores:
    """One obstore ``S3Store`` per bucket, made on first use (thread-safe enough: a race makes two, one is kept)."""

    def __init__(self, config: dict[str, Any], client: dict[str, Any]) -> None:
        self.config, self.client = config, client
        self._stores: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "client": self.client}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state["client"])

    def read(self, fs_path: str, offset: int, length: int, if_match: str | None = None) -> Response:
        """Bytes ``[offset, offset + length)`` of the object at ``bucket/key``, in one GET (no retries here:
        `with_retries` does them). Raises FileNotFoundError, `ShardChangedError` (``if_match`` failed, or the
        object is shorter than the range), OSError (anything else: retried where transient)."""
        import obstore
        from obstore.exceptions import PermissionDeniedError, PreconditionError, UnauthenticatedError
        from obstore.store import S3Store

        bucket, _, key = fs_path.partition("/")
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = S3Store(bucket, config=self.config, client_options=self.client,
                                                   retry_config={"max_retries": 0,
                                                                 "retry_timeout": datetime.timedelta(seconds=1)})
        options: dict[str, Any] = {"range": (offset, offset + length)}
        if if_match is not None:
            options["if_match"] = if_match
        try:
            result = obstore.get(store, key, options=options)
            data = pa.py_buffer(result.bytes())
        except FileNotFoundError:
            raise
        except PreconditionError as error:
            raise ShardChangedError(f"s3://{fs_path} changed while it was being read (its ETag is no longer "
                                    f"{if_match}); build the loader again to read the new content") from error
        except (PermissionDeniedError, UnauthenticatedError) as error:
            raise PermissionError(_said(error, fs_path)) from error
        except Exception as error:  # obstore's other errors: not OSErrors
            text = _said(error, fs_path)
            if "416" in text and "Range Not Satisfiable" in text:
                raise ShardChangedError(f"s3://{fs_path} is shorter than {offset + length:,} bytes now: it changed "
                                        "after it was listed (or written into the dataset's manifest); build the "
                                        "loader again") from error
            raise OSError(text) from error
        meta = result.meta
        etag = meta.get("e_tag")
        return Response(data, None if not etag else f"ETag:{etag}", meta.get("size"))


def _said(error: BaseException, fs_path: str) -> str:
    """An obstore error's message without its debug dump (the same text, repeated as Rust structures), the
    object named by its ``s3://`` URL instead of the endpoint's."""
    return re.sub(r"\bhttps?://\S+", f"s3://{fs_path}", str(error).split("\n\nDebug source:", 1)[0].strip())
