"""Schema checks: the audio, label and extra columns every shard must have, and class names from metadata."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa

from ..errors import SchemaError


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
                      "struct<bytes: binary, path: string>). Pass audio_column= naming the column that holds "
                      "the encoded audio, or re-write the shards with `audioloader pack`")


def _check_label_type(path: str, name: str, t: pa.DataType) -> None:
    if not pa.types.is_integer(t):
        raise SchemaError(f"{path}: label column {name!r} has type {t}; expected an integer type (class ids). "
                          "Map labels to integers (e.g. Hugging Face ClassLabel), pass label_column= naming an "
                          "integer column, or label_column=None for unlabeled data")


def _check_schema(path: str, schema: pa.Schema, audio: str, label: str | None, extras: Sequence[str]) -> None:
    available = ", ".join(repr(n) for n in schema.names) or "(none)"
    for role, name in [("audio", audio), ("label", label)] + [("extra", c) for c in extras]:
        if name is not None and schema.get_field_index(name) < 0:
            fix = {"audio": "Pass audio_column= with one of them",
                   "label": "Pass label_column= with one of them, or label_column=None for unlabeled data",
                   "extra": "Fix columns= (the extra columns to carry) to name existing columns"}[role]
            raise SchemaError(f"{path}: {role} column {name!r} not found; available columns: {available}. {fix}")
    _check_audio_type(path, audio, schema.field(audio).type)
    if label is not None:
        _check_label_type(path, label, schema.field(label).type)


def _label_names(schema: pa.Schema, label: str | None) -> list[str] | None:
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
