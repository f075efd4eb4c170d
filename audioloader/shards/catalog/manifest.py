"""The dataset manifest: every shard file of a folder, its size, identity and rows per unit, in one compact,
memory-mappable file, so that a start makes no LIST and no request per file.

``_audioloader_manifest.arrow`` (`MANIFEST_NAME`) in a folder of shards is an Arrow IPC file,
uncompressed, one record batch, a row per file, fixed-width columns wherever they can be:

=============  ========================  ================================================================
column         type                      what
=============  ========================  ================================================================
``name``       string (optional)         the file's name relative to the folder, without the prefix and
                                         suffix every name shares (in the schema metadata); left out
                                         when the names are ``prefix + number + suffix`` in order
``size``       int64                     bytes
``format``     uint8                     index into the ``formats`` list (schema metadata)
``schema``     uint16                    index into the dataset's distinct schemas (schema metadata:
                                         each schema once, not once a file)
``unit_rows``  list<int32>               rows of each record batch / row group / stripe: splits are
                                         planned from them exactly as from the files' footers
``digest``     uint64                    the footer digest (`formats.scan.FileMeta.digest`): checked when the
                                         footer is first read, and what checkpoints record
``etag``       fixed_size_binary(16)     the object's MD5 ETag (S3: ``"<32 hex>"`` or ``"<32 hex>-<parts>"``)
``etag_parts``  int32                    its ``-<parts>`` suffix (-1: none), or a string column ``etag``
                                         when the ETags are not of that form; both left out without ETags
``mtime_ns``   int64 (optional)          modification times (only in a manifest a machine built from a
                                         listing; a portable one has none)
``unit_bytes`` list<int64> (optional)    a tar file's unit boundaries: unit ``k`` is bytes
                                         ``[unit_bytes[k], unit_bytes[k + 1])`` (a run of whole samples,
                                         `tar_format`); null for other files; left out without tar files
=============  ========================  ================================================================

A tar file's units are recorded (its samples' headers are spread through it: without them a reader
would read the whole file to find them); a plain audio file's one unit is its whole size.

Per-unit byte ranges are left out on purpose: they would cost 16-24 bytes a unit (a Parquet row
group: a range per column), and the rank that reads a file needs its footer anyway to parse it; it
reads the footer (the file's last 64 KiB, or the whole of a small file) when it first reads the file
and checks it against the manifest then (`ShardDataset`, ``ShardChangedError``). Splits need only the
rows per unit, which the manifest has: a dataset from a manifest plans the same splits, reads the
same rows and yields the same batches as one that read every footer at construction.

Measured with this writer (`docs/storage.md`, "The dataset manifest"): 1,000,000 files of one row
group each, named ``part-NNNNNNN.parquet``, S3 ETags: about 47 bytes a file.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ShardReadError
from ..formats.scan import FORMATS, FileMeta

MANIFEST_NAME = "_audioloader_manifest.arrow"
#: Version of the layout; another one is refused with a message naming ``audioloader index``.
VERSION = b"2"
_MD5_ETAG = re.compile(r'^ETag:"([0-9a-f]{32})(?:-(\d+))?"$')
_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def manifest_table(names: Sequence[str], metas: Sequence[FileMeta], *, mtimes: bool = False) -> pa.Table:
    """The manifest of files ``names`` (relative to the manifest's folder, sorted) with their scanned metadata.

    ``mtimes``: keep the modification times (a manifest built from a listing for this machine's cache);
    leave them out for one that travels with the shards (``audioloader pack``, ``audioloader index``).
    """
    schemas: dict[bytes, int] = {}
    schema_ids = [schemas.setdefault(m.schema.serialize().to_pybytes(), len(schemas)) for m in metas]
    return manifest_columns(
        names, sizes=[m.size for m in metas], formats=[m.format for m in metas], schemas=list(schemas),
        schema_ids=schema_ids, unit_rows=[m.unit_rows for m in metas], digests=[m.digest for m in metas],
        etags=[m.etag for m in metas], mtimes=[m.mtime_ns for m in metas] if mtimes else None,
        unit_bytes=[_boundaries(m) for m in metas])


def _boundaries(meta: FileMeta) -> list[int] | None:
    """A tar file's unit boundaries (its units are contiguous: each starts where the one before ends), or None."""
    if meta.format != "tar" or meta.blocks is None:
        return None
    if not meta.blocks:
        return [0]
    return [offset for offset, _, _ in meta.blocks] + [meta.blocks[-1][0] + meta.blocks[-1][2]]


def _blocks(boundaries: Any) -> tuple[tuple[int, int, int], ...]:
    return tuple((int(a), 0, int(b) - int(a)) for a, b in itertools.pairwise(boundaries))


def manifest_columns(names: Sequence[str], *, sizes: Any, formats: Sequence[str], schemas: Sequence[bytes],
                     schema_ids: Any, unit_rows: Sequence[Sequence[int]], digests: Sequence[str],
                     etags: Sequence[str | None] | None = None, mtimes: Sequence[int | None] | None = None,
                     unit_bytes: Sequence[Sequence[int] | None] | None = None) -> pa.Table:
    """The manifest table from columns (what `manifest_table` and synthetic manifests of any size use).

    Args:
        names: file names relative to the folder, sorted, unique.
        sizes: bytes a file (int64 array-like). formats: a `formats.scan.FORMATS` name a file.
        schemas: the distinct schemas, serialized (``schema.serialize().to_pybytes()``);
            schema_ids: the index of each file's schema in them.
        unit_rows: rows of each unit, a sequence a file. digests: `FileMeta.digest` (16 hex digits) a file.
        etags: `identity.object_identity` a file (None: unknown). mtimes: ns a file, or None to leave them out.
        unit_bytes: a tar file's unit boundaries, None for other files (`_boundaries`); left out when all None.
    """
    count = len(names)
    format_names = sorted(set(formats), key=FORMATS.index)
    lengths = np.fromiter((len(u) for u in unit_rows), dtype=np.int64, count=count)
    flat = np.fromiter((r for u in unit_rows for r in u), dtype=np.int64, count=int(lengths.sum()))
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = flat.astype(np.int32) if flat.size == 0 or flat.max() < 2**31 else flat
    metadata = {b"audioloader_manifest": VERSION, b"formats": json.dumps(format_names).encode(),
                b"schemas": json.dumps([base64.b64encode(s).decode() for s in schemas]).encode()}
    columns: dict[str, pa.Array] = {}
    pattern = _name_pattern(names)
    if pattern is not None:
        metadata[b"names"] = json.dumps(pattern).encode()
    else:
        prefix, suffix = _common_affixes(names)
        metadata[b"names"] = json.dumps({"prefix": prefix, "suffix": suffix}).encode()
        columns["name"] = pa.array([n[len(prefix):len(n) - len(suffix)] for n in names], pa.string())
    codes = {name: i for i, name in enumerate(format_names)}
    columns.update(
        size=pa.array(np.asarray(sizes, dtype=np.int64)),
        format=pa.array(np.fromiter((codes[f] for f in formats), dtype=np.uint8, count=count)),
        schema=pa.array(np.asarray(schema_ids, dtype=np.uint16)),
        unit_rows=pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        digest=pa.array(np.fromiter((int(d, 16) if d else 0 for d in digests), dtype=np.uint64, count=count)))
    columns.update(_etag_columns(etags, count))
    if mtimes is not None and any(m is not None for m in mtimes):
        columns["mtime_ns"] = pa.array(list(mtimes), pa.int64())
    if unit_bytes is not None and any(b is not None for b in unit_bytes):
        columns["unit_bytes"] = pa.array(list(unit_bytes), pa.list_(pa.int64()))
    table = pa.table(columns)
    return table.replace_schema_metadata(metadata)


def _etag_columns(etags: Sequence[str | None] | None, count: int) -> dict[str, pa.Array]:
    """``etag`` (+ ``etag_parts``) columns: 16 bytes (+ 4) a file for S3's MD5 ETags, else strings; none without."""
    if etags is None or all(e is None for e in etags):
        return {}
    matches = [None if e is None else _MD5_ETAG.match(e) for e in etags]
    if all(m is not None for m in matches):
        digests = np.frombuffer(bytes.fromhex("".join(m.group(1) for m in matches)), dtype=np.uint8)
        return {"etag": pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), count, [None, pa.py_buffer(digests)]),
                "etag_parts": pa.array(np.fromiter((-1 if m.group(2) is None else int(m.group(2)) for m in matches),
                                                   dtype=np.int32, count=count))}
    return {"etag": pa.array(list(etags), pa.string())}


def _name_pattern(names: Sequence[str]) -> dict[str, Any] | None:
    """``{"prefix", "suffix", "width", "start"}`` when ``names[i] == prefix + f"{start + i:0{width}d}" + suffix``
    for every i (so no name need be stored), else None."""
    if not names:
        return None
    match = _NUMBERED.match(names[0])
    if match is None:
        return None
    prefix, number, suffix = match.groups()
    width, start = len(number), int(number)
    for i in (len(names) - 1, *range(len(names))):  # the last first: most datasets that fail, fail there
        if names[i] != f"{prefix}{start + i:0{width}d}{suffix}":
            return None
    return {"prefix": prefix, "suffix": suffix, "width": width, "start": start}


def _common_affixes(names: Sequence[str]) -> tuple[str, str]:
    """The longest prefix and suffix every name shares (not overlapping in the shortest name)."""
    if not names:
        return "", ""
    prefix = os.path.commonprefix(list(names))  # noqa: RUF071 (names, not paths)
    rest = [n[len(prefix):] for n in names]
    suffix = os.path.commonprefix([r[::-1] for r in rest])[::-1]  # noqa: RUF071
    return prefix, suffix


def write_manifest(table: pa.Table, path: str, fs: Any = None) -> int:
    """Write a manifest table to ``path`` (local: atomically, a temporary file renamed over it; else through
    the pyarrow filesystem ``fs``); returns its bytes."""
    def write(out: Any) -> None:
        with pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(1, table.num_rows))

    if fs is not None:
        with fs.open_output_stream(path) as out:
            write(out)
            return out.tell()
    replace_atomically(path, write, prefix=".manifest-")
    return os.path.getsize(path)


def replace_atomically(path: str, write: Callable[[Any], None], prefix: str) -> None:
    """Write a local file through ``write(binary file)`` into a hidden temporary sibling, fsync it and rename it
    over ``path``: readers see the old file or the whole new one, never a part.

    The file gets the permissions of any file this process creates (``0666`` less the umask, as the shards
    ``ShardWriter`` writes), not ``tempfile.mkstemp``'s ``0600``: on a shared file system the group that reads the
    shards must read the manifest too. A failure removes the temporary file.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f"{prefix}{secrets.token_hex(8)}.tmp")
    try:
        with open(temporary, "xb") as out:  # O_CREAT | O_EXCL, mode 0666 & ~umask
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class Manifest:
    """A manifest, read in place (memory-mapped or from a buffer): nothing is copied per file until asked for.

    Args:
        source: the manifest's bytes (a ``pyarrow.Buffer``) or a local path (memory-mapped).
        where: how to name it in errors (its URL or path).

    Attributes:
        num_files: files listed. nbytes: the manifest's bytes (what a rank maps).
        sizes: int64 a file (a view of the map); file_rows: int64 a file (computed when asked for).
        unit_offsets, unit_values: the ``unit_rows`` list column's offsets and values (views of the map).
        format_names: the formats that ``format_codes`` (uint8 a file) index.

    Raises:
        ShardReadError: not a manifest, or a manifest of another version (the message names ``audioloader index``).
    """

    def __init__(self, source: Any, where: str) -> None:
        self.where = where
        try:
            if isinstance(source, (str, os.PathLike)):
                buffer: Any = pa.memory_map(os.fspath(source), "r")
            else:
                buffer = pa.BufferReader(source)
            reader = pa.ipc.open_file(buffer)
            batch = reader.get_batch(0) if reader.num_record_batches else None
        except (OSError, pa.ArrowException, ValueError) as error:
            head = ("" if isinstance(source, (str, os.PathLike)) else
                    f"; {source.size:,} bytes: {source[:12].to_pybytes()!r}...")
            raise ShardReadError(f"{where} is not an audioloader manifest ({error}{head}); write it again with "
                                 "`audioloader index FOLDER`") from error
        metadata = reader.schema.metadata or {}
        version = metadata.get(b"audioloader_manifest")
        if version != VERSION or batch is None:
            raise ShardReadError(f"{where} is a manifest of version {version!r}, this audioloader reads {VERSION!r}; "
                                 "write it again with `audioloader index FOLDER` (or `audioloader pack`)")
        self.nbytes = buffer.size()
        self._file = buffer  # the map (or the buffer) this process read: what a pickle carries
        self._batch = batch
        self.num_files = batch.num_rows
        self.format_names: list[str] = json.loads(metadata[b"formats"])
        self._formats = self.format_names
        self._schema_bytes = [base64.b64decode(s) for s in json.loads(metadata[b"schemas"])]
        self._schemas: dict[int, pa.Schema] = {}
        self._names = json.loads(metadata[b"names"])
        self.sizes = batch.column("size").to_numpy()
        units = batch.column("unit_rows")
        self.unit_offsets = self._unit_offsets = units.offsets.to_numpy()
        self.unit_values = self._unit_values = units.values.to_numpy()
        self.format_codes = self._format_codes = batch.column("format").to_numpy()
        self._schema_ids = batch.column("schema").to_numpy()
        self._digests = batch.column("digest").to_numpy()
        names = batch.schema.names
        self._etags = batch.column("etag") if "etag" in names else None
        self._etag_parts = batch.column("etag_parts").to_numpy() if "etag_parts" in names else None
        self._etag_bytes = memoryview(self._etags.buffers()[1]) if self._etag_parts is not None else None
        self._mtimes = batch.column("mtime_ns") if "mtime_ns" in names else None
        self._unit_bytes = batch.column("unit_bytes") if "unit_bytes" in names else None

    # ----------------------------------------------------------------- per file

    def name(self, i: int) -> str:
        """File ``i``'s name relative to the manifest's folder."""
        names = self._names
        if "width" in names:
            return f"{names['prefix']}{names['start'] + i:0{names['width']}d}{names['suffix']}"
        return f"{names['prefix']}{self._batch.column('name')[i].as_py()}{names['suffix']}"

    def names(self) -> list[str]:
        """Every file's name, in order (sorted)."""
        names = self._names
        prefix, suffix = names["prefix"], names["suffix"]
        if "width" in names:
            start, width = names["start"], names["width"]
            return [f"{prefix}{start + i:0{width}d}{suffix}" for i in range(self.num_files)]
        return [f"{prefix}{middle}{suffix}" for middle in self._batch.column("name").to_pylist()]

    def unit_rows(self, i: int) -> tuple[int, ...]:
        return tuple(self._unit_values[self._unit_offsets[i]:self._unit_offsets[i + 1]].tolist())

    def format(self, i: int) -> str:
        return self._formats[self._format_codes[i]]

    def schema(self, i: int) -> pa.Schema:
        """File ``i``'s schema (each distinct schema parsed once, shared by its files)."""
        return self._distinct_schema(int(self._schema_ids[i]))

    def _distinct_schema(self, sid: int) -> pa.Schema:
        schema = self._schemas.get(sid)
        if schema is None:
            schema = self._schemas[sid] = pa.ipc.read_schema(pa.py_buffer(self._schema_bytes[sid]))
        return schema

    def digest(self, i: int) -> str:
        return f"{int(self._digests[i]):016x}"

    def etag(self, i: int) -> str | None:
        """File ``i``'s identity as `identity.object_identity` gives it, or None."""
        if self._etags is None:
            return None
        if self._etag_parts is None:
            return self._etags[i].as_py()
        parts = int(self._etag_parts[i])
        digest = self._etag_bytes[16 * i:16 * i + 16].hex()
        return f'ETag:"{digest}{"" if parts < 0 else f"-{parts}"}"'

    def mtime_ns(self, i: int) -> int | None:
        return None if self._mtimes is None else self._mtimes[i].as_py()

    def meta(self, i: int) -> FileMeta:
        """File ``i``'s `FileMeta` as far as the manifest knows it: no footer (``located`` False); a tar file's
        units (checked against the file at its first read), a plain audio file's one unit (``located``)."""
        fmt, size = self.format(i), int(self.sizes[i])
        blocks = None
        if fmt == "tar" and self._unit_bytes is not None and self._unit_bytes[i].is_valid:
            blocks = _blocks(self._unit_bytes[i].values.to_numpy())
        elif fmt == "audio_file":
            blocks = ((0, 0, size),)
        return FileMeta(fmt, size, self.schema(i), self.unit_rows(i), blocks=blocks,
                         mtime_ns=self.mtime_ns(i), digest=self.digest(i), etag=self.etag(i),
                         located=fmt == "audio_file")

    def distinct_schemas(self) -> list[tuple[int, pa.Schema]]:
        """``(first file, schema)`` of each distinct schema the files have, in order of first file."""
        ids = self._schema_ids
        present = np.flatnonzero(np.bincount(ids, minlength=len(self._schema_bytes)))
        if len(present) <= 16:  # the usual few: a pass over the ids each, no sort
            pairs = sorted((int(np.argmax(ids == s)), int(s)) for s in present)
        else:
            unique, first = np.unique(ids, return_index=True)
            pairs = sorted(zip(first.tolist(), unique.tolist(), strict=True))
        return [(int(f), self._distinct_schema(int(s))) for f, s in pairs]

    def values(self, name: str) -> list[Any]:
        """Every file's ``digest``, ``mtime_ns`` or ``etag`` as `meta` gives them, as a list (no meta made)."""
        if name == "digest":
            return [f"{d:016x}" for d in self._digests.tolist()]
        if name == "mtime_ns":
            return [None] * self.num_files if self._mtimes is None else self._mtimes.to_pylist()
        if name == "etag":
            return [None] * self.num_files if self._etags is None else [self.etag(i) for i in range(self.num_files)]
        raise ValueError(f"a manifest has no per-file {name!r}; ask for 'digest', 'mtime_ns' or 'etag'")

    @property
    def file_rows(self) -> np.ndarray:
        """Rows a file (int64), computed from the rows per unit."""
        starts = np.zeros(len(self._unit_values) + 1, dtype=np.int64)
        np.cumsum(self._unit_values, out=starts[1:])
        return starts[self._unit_offsets[1:]] - starts[self._unit_offsets[:-1]]

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        # A worker gets the bytes this process read, not the path: the machine's shared copy may be published
        # again meanwhile (`machine_cache.shared_file`).
        return Manifest, (pa.py_buffer(bytes(self._file.read_at(self.nbytes, 0))), self.where)


def mismatch(expected: FileMeta, found: FileMeta) -> str | None:
    """What differs between a file as a manifest describes it and as its first read found it, or None."""
    differences = []
    for what, a, b in (("size", expected.size, found.size), ("format", expected.format, found.format),
                       ("rows per unit", expected.unit_rows, found.unit_rows),
                       ("footer digest", expected.digest, found.digest)):
        if a != b:
            differences.append(f"{what} {a} -> {b}")
    if (expected.etag is not None and found.etag is not None and expected.etag != found.etag
            and expected.etag.split(":", 1)[0] == found.etag.split(":", 1)[0]):  # of one kind (ETag, version...)
        differences.append(f"identity {expected.etag} -> {found.etag}")
    return "; ".join(differences) or None
