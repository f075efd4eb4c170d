"""The ``audioloader`` command line: ``pack``, ``inspect``, ``index``, ``demo``, ``bench``, ``doctor``.

Also runs as ``python -m audioloader``. ``main(argv)`` returns the exit status:
0 success, 1 an error in the input or arguments (one line on stderr, no
traceback), 2 a usage error (argparse) or a command not available, 130 Ctrl-C.

Nothing here imports torch: ``audioloader --help`` imports no command module, and
``audioloader COMMAND --help`` only the module of that command, which must not import
torch at its top (a command imports torch in the function that needs it), so every
``--help`` answers at once. tests/test_cli.py checks it.

``demo``, ``bench`` and ``doctor`` live in their own modules, imported only when used. Their
contract with this file: ``audioloader.tools.<name>`` defines ``main(args)``; if it
also defines ``add_arguments(parser)``, the arguments are parsed with that parser
and ``main`` gets the ``argparse.Namespace``, otherwise ``main`` gets the list of
argument strings after the command name. ``main`` returns an exit status or ``None`` (0).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from audioloader.errors import AudioLoaderError, OptionError

__all__ = ["build_parser", "main"]

#: Commands whose module is imported only when the command runs.
LAZY_COMMANDS = {
    "demo": "run the end-to-end demo (audioloader.tools.demo)",
    "bench": "measure loading throughput (audioloader.tools.bench)",
    "doctor": "what bounds a loading run and the cores it needs (audioloader.tools.doctor)",
}


def _first_paragraph(doc: str | None) -> str | None:
    # Docstrings use reStructuredText literals; the terminal wants plain text.
    return doc.strip().split("\n\n")[0].replace("``", "") if doc else None


# The commands this parser defines itself. Each function fills in its sub-parser and imports its
# command's module, so that only the command being run (or asked for --help) is imported.


def _pack(p: argparse.ArgumentParser) -> None:
    from audioloader.tools import pack

    p.description = _first_paragraph(pack.__doc__)
    pack.add_arguments(p)
    p.set_defaults(func=_run_pack)


def _run_pack(args: argparse.Namespace) -> int:
    """Run ``audioloader pack`` with parsed ``args`` (here, not in `pack`: the Ray runner imports `pack`)."""
    from audioloader.tools.pack import pack_dataset
    from audioloader.tools.pack_from import detect_container, pack_from

    if args.container is not None or detect_container(args.src) is not None:  # audio in a container (issue 35)
        summary = pack_from(args.src, args.out, args.container or "auto", tars=args.tars, fmt=args.fmt,
                            rows_per_batch=args.rows_per_batch, shard_mb=args.shard_mb or None)
        if not args.quiet:
            print(summary.text())
        return 0
    options = dict(fmt=args.fmt, input_format=args.input_format, shard_rows=args.shard_rows,
                   shard_mb=args.shard_mb or None, rows_per_batch=args.rows_per_batch, sample_rate=args.sample_rate,
                   codec=args.codec, workers=args.workers, shuffle_seed=args.shuffle_seed, overwrite=args.overwrite,
                   verify=args.verify, progress=not args.quiet)
    if args.ray is not None:
        if args.part is not None:
            raise ValueError("--part and --ray: --ray runs every part itself; give --parts N instead")
        from audioloader.tools import pack_ray as ray_pack

        summary = ray_pack.pack(args.src, args.out, parts=args.parts,
                                address=None if args.ray == "auto" else args.ray, **options)
    else:
        if args.parts is not None:
            raise ValueError("--parts N is for --ray; to run one part yourself, give --part K/N")
        summary = pack_dataset(args.src, args.out, part=args.part, **options)
    if not args.quiet:
        print(summary.text())
    return 0


def _inspect(p: argparse.ArgumentParser) -> None:
    from audioloader.tools import inspect_shards

    p.description = _first_paragraph(inspect_shards.__doc__)
    inspect_shards.add_arguments(p)
    p.set_defaults(func=inspect_shards.run)


def _index(p: argparse.ArgumentParser) -> None:
    p.description = ("Write the dataset manifest _audioloader_manifest.arrow into a folder of shards (local or a URL "
                     "such as s3://bucket/data): every file's name, size, ETag and rows per record batch / row group, "
                     "about 50 bytes a file. Loaders then start from it with no listing and no request per file "
                     "(one download per machine). Run it again after adding, removing or rewriting shards. A "
                     "folder that `audioloader pack --part K/N` writes is indexed once every part has finished.")
    p.add_argument("folder", help="folder of shards, WebDataset tars or audio files (path or URL)")
    p.add_argument("--portable", action="store_true",
                   help="accepted for 0.3 scripts; a manifest never holds modification times")
    p.set_defaults(func=_run_index)


#: name -> (one-line help, the function that fills in its sub-parser).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "pack": ("pack audio into shards: class folders, CSV/TSV/JSONL manifests (segments too), a Hugging Face "
             "audiofolder, LibriSpeech, Common Voice", _pack),
    "inspect": ("summarize shards: files, rows, schema, labels, audio formats", _inspect),
    "index": ("write a folder's dataset manifest (a start with no listing, no request per file)", _index),
}


def _version() -> str:
    import audioloader

    return audioloader.__version__


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``audioloader``: every command listed, and the arguments of ``command`` (all of
    ``pack``, ``inspect`` and ``index`` when None; ``demo``/``bench`` parse their own, see `main`)."""
    parser = argparse.ArgumentParser(
        prog="audioloader",
        description="Pack audio into Arrow shards, inspect shards, and run the demo and benchmarks.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if command is None or command == name:
            add(p)

    # Listed for --help only: main() hands these to their module before argparse
    # runs, so that the module's own parser handles all their options.
    for name, help_text in LAZY_COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _run_index(args: argparse.Namespace) -> int:
    from audioloader.shards import ShardDataset
    from audioloader.shards.catalog.manifest_source import write_folder_manifest
    from audioloader.tools.pack_store import require_finished

    require_finished(args.folder)  # a split pack still writing parts would be indexed half
    path = write_folder_manifest(args.folder)
    indexed = ShardDataset(args.folder)  # from the manifest just written: no listing, no footer read
    print(f"{path}: {len(indexed.files)} shard file(s), {indexed.num_rows} rows")
    return 0


#: What an interrupted command leaves, said after "interrupted".
_AFTER_INTERRUPT = {"pack": "; the finished shards are kept: run the same command again to continue"}


def _report_errors(command: str, fn: Callable[[], Any]) -> int:
    """Run ``fn``; turn expected errors into one line on stderr and an exit status."""
    try:
        status = fn()
    except KeyboardInterrupt:
        print(f"audioloader {command}: interrupted{_AFTER_INTERRUPT.get(command, '')}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `audioloader inspect ... | head`: the reader left; quietly stop, and keep
        # Python from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError, AudioLoaderError) as e:
        # An OptionError names options as the command line spells them (--overwrite, not overwrite=True).
        print(f"audioloader {command}: error: {e.cli if isinstance(e, OptionError) else e}", file=sys.stderr)
        return 1
    return 0 if status is None else int(status)


def _run_lazy(name: str, argv: list[str]) -> int:
    module_name = f"audioloader.tools.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise  # the module exists but one of its imports is missing: show that
        print(f"audioloader {name}: not available yet ({module_name} is not written/installed yet)",
              file=sys.stderr)
        return 2
    if hasattr(module, "add_arguments"):
        parser = argparse.ArgumentParser(prog=f"audioloader {name}", description=_first_paragraph(module.__doc__))
        module.add_arguments(parser)
        args: Any = parser.parse_args(argv)
    else:
        args = list(argv)
    return _report_errors(name, lambda: module.main(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``audioloader``; ``argv`` defaults to ``sys.argv[1:]``. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LAZY_COMMANDS:
        return _run_lazy(argv[0], argv[1:])
    # The command is the first word that is not an option (the top level's options take no value).
    command = next((word for word in argv if not word.startswith("-")), "")
    args = build_parser(command).parse_args(argv)
    return _report_errors(args.command, lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
