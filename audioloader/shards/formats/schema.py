"""Schema checks: the audio, label and extra columns of the shards, the files' unified schema, and class names.

Files of one source may differ compatibly (schema evolution): a column added in
later files, a widened integer or float, ``binary`` vs ``large_binary``,
``string`` vs ``large_string``. `unify` gives the schema they are read with; a
file that lacks a column reads it as nulls (`readers.conform`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ...errors import SchemaError


def _is_binary(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or (hasattr(pa.types, "is_binary_view") and pa.types.is_binary_view(t)))


def _check_audio_type(path: str, name: str, t: pa.DataType) -> None:
    if _is_binary(t):
        return
    if pa.types.is_struct(t):
        index = t.get_field_index("bytes")
        if index >= 0 and _is_binary(t.field(index).type):
            return
    raise SchemaError(f"{path}: audio column {name!r} has type {t}; expected binary or large_binary "
                      "(encoded audio bytes) or a struct with a binary 'bytes' field (Hugging Face Audio, "
                      "struct<bytes: binary, path: string>). Name the column that holds the encoded audio "
                      "with al.Source(..., audio_column=...), or re-write the shards with `audioloader pack`")


def _check_label_type(path: str, name: str, t: pa.DataType) -> None:
    if not pa.types.is_integer(t):
        raise SchemaError(f"{path}: label column {name!r} has type {t}; expected an integer type (class ids). "
                          "Map labels to integers (e.g. Hugging Face ClassLabel), name an integer column "
                          "with al.Source(..., label_column=...), or read unlabeled data with "
                          "al.Source(..., label_column=None)")


_FIXES = {"audio": "Name one of them with al.Source(..., audio_column=...)",
          "label": "Name one of them with al.Source(..., label_column=...), or read unlabeled data with "
                   "al.Source(..., label_column=None)",
          "extra": "Fix columns= (the extra columns to carry) to name existing columns"}


def _missing(paths: Sequence[str], role: str, name: str, names: Sequence[str]) -> SchemaError:
    available = ", ".join(repr(n) for n in names) or "(none)"
    where = (f"{paths[0]}: {role} column {name!r} not found" if len(paths) == 1 else
             f"{role} column {name!r} not found in any of the {len(paths)} shard files (first: {paths[0]})")
    return SchemaError(f"{where}; available columns: {available}. {_FIXES[role]}")


def check_schema(path: str, schema: pa.Schema, audio: str, label: str | None) -> None:
    """One file: it has the audio column, and the audio and label (where present) have usable types."""
    if schema.get_field_index(audio) < 0:
        raise _missing([path], "audio", audio, schema.names)
    _check_audio_type(path, audio, schema.field(audio).type)
    if label is not None and schema.get_field_index(label) >= 0:
        _check_label_type(path, label, schema.field(label).type)


@dataclass
class Unified:
    """The schema files of one source are read with, and the columns they disagree on.

    Attributes:
        schema: every column of any file, in order of first appearance, with the type
            that holds every file's values; a column some file lacks is nullable
            (read as nulls there). Metadata from the first file.
        conflicts: ``{column: message}`` for columns whose types cannot be unified
            (kept in ``schema`` with the first file's type): an error once such a
            column is used (read, or in a filter).
    """

    schema: pa.Schema
    conflicts: dict[str, str]

    def check_used(self, names: Sequence[str]) -> None:
        """`SchemaError` naming both files if one of ``names`` has conflicting types."""
        for name in names:
            if name in self.conflicts:
                raise SchemaError(self.conflicts[name])


def unify(paths: Sequence[str], schemas: Sequence[pa.Schema]) -> Unified:
    """The `Unified` schema of files ``paths`` with ``schemas`` (distinct schemas are compared once)."""
    distinct: dict[tuple, tuple[str, pa.Schema]] = {}
    for path, schema in zip(paths, schemas, strict=True):
        distinct.setdefault(tuple(zip(schema.names, schema.types, strict=True)), (path, schema))
    types: dict[str, tuple[pa.DataType, str]] = {}  # column -> (unified type so far, the file that made it so)
    conflicts: dict[str, str] = {}
    for path, schema in distinct.values():
        for field in schema:
            if field.name not in types:
                types[field.name] = (field.type, path)
                continue
            current, origin = types[field.name]
            wider = _widened(current, field.type)
            if wider is None:
                conflicts.setdefault(field.name, f"column {field.name!r} has type {current} in {origin} but "
                                                 f"{field.type} in {path}; all shards must agree on the used "
                                                 "columns (or differ only by widening: a wider integer or float, "
                                                 "large_binary for binary, large_string for string). Re-write the "
                                                 "odd shards with the same schema, or read them as separate sources")
            elif wider != current:
                types[field.name] = (wider, path)
    everywhere = set.intersection(*(set(schema.names) for _, schema in distinct.values()))
    fields = [pa.field(name, t, nullable=True) if name not in everywhere else _first_field(schemas, name, t)
              for name, (t, _) in types.items()]
    return Unified(pa.schema(fields, metadata=schemas[0].metadata), conflicts)


def _first_field(schemas: Sequence[pa.Schema], name: str, t: pa.DataType) -> pa.Field:
    field = schemas[0].field(name)
    return field if field.type == t else field.with_type(t)


def check_columns(unified: Unified, paths: Sequence[str], audio: str, label: str | None,
                  extras: Sequence[str]) -> None:
    """The label and extra columns exist in some file, and no used column has conflicting types."""
    names = unified.schema.names
    for role, name in [("label", label)] + [("extra", c) for c in extras]:
        if name is not None and name not in names:
            raise _missing(paths, role, name, names)
    unified.check_used([audio, *([label] if label else []), *extras])


def _widened(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds every value of ``a`` and of ``b`` without loss (pyarrow's promotion), or None."""
    if a == b:
        return a
    try:
        wider = pa.unify_schemas([pa.schema([("x", a)]), pa.schema([("x", b)])],
                                 promote_options="permissive").field(0).type
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return wider if _holds(wider, a) and _holds(wider, b) else None


def _holds(wide: pa.DataType, t: pa.DataType) -> bool:
    """Whether every value of ``t`` casts to ``wide`` unchanged (pyarrow's permissive promotion may lose some:
    int64 + uint64 -> int64, int64 + double -> double, string + binary -> binary)."""
    types = pa.types
    if wide == t or types.is_null(t):
        return True
    if types.is_integer(wide) and types.is_integer(t):
        if types.is_signed_integer(wide) == types.is_signed_integer(t):
            return wide.bit_width >= t.bit_width
        return types.is_signed_integer(wide) and wide.bit_width > t.bit_width
    if types.is_floating(wide) and types.is_floating(t):
        return wide.bit_width >= t.bit_width
    if _is_string(wide) and _is_string(t):
        return True
    if _is_binary(wide) and _is_binary(t):
        return True
    if types.is_struct(wide) and types.is_struct(t):
        return [f.name for f in wide] == [f.name for f in t] and all(
            _holds(wide.field(i).type, t.field(i).type) for i in range(t.num_fields))
    return False


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def label_names(schema: pa.Schema, label: str | None) -> list[str] | None:
    """Class names from our writer's ``audioloader`` metadata or a Hugging Face ClassLabel."""
    metadata = schema.metadata or {}
    try:
        if b"audioloader" in metadata:
            labels = json.loads(metadata[b"audioloader"]).get("labels")
            if isinstance(labels, list):
                return [str(x) for x in labels]
        if label is not None and b"huggingface" in metadata:
            feature = json.loads(metadata[b"huggingface"])["info"]["features"].get(label, {})
            if feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
                return [str(x) for x in feature["names"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # foreign or malformed metadata: names are optional
    return None
