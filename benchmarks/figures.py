"""The charts of docs/benchmarks.md, drawn from the numbers in docs/figures/data/*.json.

    python -m benchmarks.figures            # (re)draw every chart whose numbers changed; rewrite the docs' numbers
    python -m benchmarks.figures --force    # draw them all
    python -m benchmarks.figures --check    # exit 1 if a chart or a number in the docs differs from its data

Each ``docs/figures/data/NAME.json`` holds one benchmark table as it was measured
(``command``, ``date``, ``commit``, ``machine`` and the rows), transcribed from a
benchmark's JSON output or its table in docs/benchmarks.md; ``docs/figures/NAME.png``
is drawn from it by ``draw_NAME`` below. The PNG carries a digest of its JSON (and of
`STYLE`) in its metadata, so ``--check`` (run by tests/test_docs.py) needs no matplotlib
and no pixel comparison: a chart is current when its digest matches. To change a
figure, change its JSON (a new run: new numbers, command, date) and run this script.

The numbers the docs' prose quotes come from the same JSON files (and from docs/numbers/*.json
for measurements without a chart) through spans ``<!--n KEY-->text<!--/n-->``: this script
rewrites their text and ``--check`` compares it (benchmarks/doc_numbers.py says how to write one).

Drawing needs matplotlib (``pip install -e '.[docs]'``); checking does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import doc_numbers  # the numbers quoted in the docs' prose
from benchmarks.common import ROOT

DATA = ROOT / "docs" / "figures" / "data"
OUT = ROOT / "docs" / "figures"
#: Numbers the docs quote that have no chart (see benchmarks/doc_numbers.py).
NUMBERS = ROOT / "docs" / "numbers"

#: Bump when the drawing code changes, so every chart counts as stale and is drawn again.
STYLE = "3"

#: The PNG text chunk holding ``sha256:<digest of the JSON and STYLE>``.
DIGEST_KEY = "audioloader-figure-data"

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Colours: audioloader, the peers / baselines, the ceilings or limits.
OURS, PEER, CEILING, OTHER = "#1f77b4", "#7f7f7f", "#bcbd22", "#ff7f0e"


def digest(data_file: Path) -> str:
    """``sha256:<hex>`` of the JSON file's bytes and `STYLE`."""
    return "sha256:" + hashlib.sha256(data_file.read_bytes() + f"\nstyle {STYLE}".encode()).hexdigest()


def png_text(png: Path) -> dict[str, str]:
    """The tEXt / iTXt / zTXt entries of a PNG file (keyword -> text)."""
    blob = png.read_bytes()
    if not blob.startswith(_PNG_SIGNATURE):
        raise ValueError(f"{png} is not a PNG file")
    out, at = {}, len(_PNG_SIGNATURE)
    while at + 8 <= len(blob):
        length, kind = struct.unpack(">I4s", blob[at:at + 8])
        body = blob[at + 8:at + 8 + length]
        at += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode("utf-8")
        elif kind == b"IEND":
            break
    return out


def stale(data_dir: Path = DATA, out_dir: Path = OUT) -> list[str]:
    """Why each chart is not current (missing, drawn from other numbers, without numbers); empty when all are."""
    problems = []
    names = sorted(p.stem for p in data_dir.glob("*.json"))
    for name in names:
        png = out_dir / f"{name}.png"
        if name not in DRAW:
            problems.append(f"{data_dir / (name + '.json')}: no draw_{name} in benchmarks/figures.py")
        elif not png.exists():
            problems.append(f"{png}: missing")
        elif png_text(png).get(DIGEST_KEY) != digest(data_dir / f"{name}.json"):
            problems.append(f"{png}: drawn from other numbers than {name}.json (or an older style)")
    for png in sorted(out_dir.glob("*.png")):
        if png.stem not in names:
            problems.append(f"{png}: no {png.stem}.json in {data_dir}")
    return problems


# -- the charts --------------------------------------------------------------------------------------------------


def commit_text(commit: str | dict[str, str | None]) -> str:
    """A data file's ``commit`` for a reader: as it is, or ``name abc1234, ...`` for a run of several projects
    (a run of one project, ``{"this": "abc1234"}``, is just ``abc1234``)."""
    if isinstance(commit, str):
        return commit
    if len(commit) == 1:
        return str(next(iter(commit.values())))
    return ", ".join(f"{name} {value}" for name, value in commit.items())


def _footnote(fig: Any, data: dict[str, Any]) -> None:
    fig.text(0.01, 0.01, f"{data['date']}, {commit_text(data['commit'])}: {data['command']}\n{data['machine']}",
             fontsize=7, color="#555555", va="bottom", wrap=True)


def _bar_labels(ax: Any, bars: Any, texts: list[str]) -> None:
    for bar, text in zip(bars, texts, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}", va="center", fontsize=8)


def _column_labels(ax: Any, bars: Any, texts: list[str]) -> None:
    """`_bar_labels` for upright bars: each text centred above its bar."""
    for bar, text in zip(bars, texts, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), text, ha="center", va="bottom", fontsize=7)


def draw_peers(plt: Any, data: dict[str, Any]) -> Any:
    """Samples/s and time to the first batch per contender, × the user baseline on audioloader's bars."""
    rows = data["rows"]
    baseline = next(r["samples_per_s"] for r in rows if r["contender"] == "baseline-torchaudio")
    labels = [f"{r['contender']}  ({r['data']})" for r in rows]
    colors = [PEER if r["contender"].startswith("baseline") else CEILING if r["contender"].startswith("ceiling")
              else OURS for r in rows]
    fig, (rate, first) = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True, gridspec_kw={"width_ratios": [3, 1.4]})
    y = list(range(len(rows)))[::-1]
    bars = rate.barh(y, [r["samples_per_s"] for r in rows], color=colors)
    _bar_labels(rate, bars, [f"{r['samples_per_s']}  ({r['samples_per_s'] / baseline:.2f}×)" for r in rows])
    rate.set_yticks(y, labels, fontsize=8)
    rate.set_xlabel("samples/s (× baseline-torchaudio)")
    rate.set_xlim(0, max(r["samples_per_s"] for r in rows) * 1.25)
    timed = [(yy, r) for yy, r in zip(y, rows, strict=True) if r["first_batch_s"] is not None]
    bars = first.barh([yy for yy, _ in timed], [r["first_batch_s"] for _, r in timed],
                      color=[colors[rows.index(r)] for _, r in timed])
    _bar_labels(first, bars, [f"{r['first_batch_s']:.2f} s" for _, r in timed])
    first.set_xlabel("first batch, s")
    first.set_xlim(0, max(r["first_batch_s"] for _, r in timed) * 1.35)
    fig.suptitle("Batches of 64 log-mels [128, 501] on 2 cores: audioloader, a DataLoader baseline, the ceiling",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    _footnote(fig, data)
    return fig


def draw_scaling(plt: Any, data: dict[str, Any]) -> Any:
    """Samples/s against N workers, one panel per dataset: on 2 cores, and (``sixteen_cores``) on 16 cores with
    0.1's series and 0.3's points at N = 16."""
    workers = data["workers"]
    style = {"AudioLoader, processes": (OURS, "-", "o"), "AudioLoader, threads": (OURS, "--", "s"),
             "DataLoader baseline": (PEER, "-", "^"), "per-sample function in N processes (limit)": (CEILING, ":", "D")}
    panels = data["series"]
    sixteen = data.get("sixteen_cores")
    rows = 2 if sixteen else 1
    fig, axes = plt.subplots(rows, len(panels), figsize=(11, 4.4 * rows), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        for label, values in series.items():
            color, line, marker = style.get(label, (OTHER, "-", "x"))
            ax.plot(workers, values, color=color, linestyle=line, marker=marker, label=label)
        ax.set_title(f"{name}, 2 cores ({data['commit']})", fontsize=10)
        ax.set_xticks(workers)
        ax.set_xlabel("decode workers N (2 cores)")
        ax.set_ylabel("samples/s")
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    if sixteen:
        _sixteen_core_panels(axes[1], sixteen, style)
    fig.suptitle("Scaling with workers: threads vs processes vs DataLoader", fontsize=11)
    fig.tight_layout(rect=(0, 0.08 if rows == 1 else 0.07, 1, 1))
    _footnote(fig, data)
    if sixteen:
        fig.text(0.01, 0.045, sixteen["machine"], fontsize=7, color="#555555", va="bottom", wrap=True)
    return fig


def _sixteen_core_panels(axes: Any, sixteen: dict[str, Any], style: dict[str, tuple[str, str, str]]) -> None:
    """0.1 on 16 cores as lines (threads, the DataLoader; the limit at 16 as a point), 0.3 at N = 16 as large
    points (processes, the limit, the DataLoader), each labelled with its rate."""
    workers = sixteen["workers"]
    for ax, (name, series) in zip(axes, sixteen["series"].items(), strict=True):
        for label, values in series.items():
            color, line, marker = style.get(label.removeprefix("0.1 "), (OTHER, "-", "x"))
            points = [(n, v) for n, v in zip(workers, values, strict=True) if v is not None]
            ax.plot([n for n, _ in points], [v for _, v in points], color=color, linestyle=line, marker=marker,
                    alpha=0.55, label=label)
        for label, value in sixteen["at_16"][name].items():
            color, _, marker = style.get(label.removeprefix("0.3 ").replace("16 processes", "N processes"),
                                         (OTHER, "-", "x"))
            ax.plot([16], [value], marker=marker, markersize=11, color=color, markeredgecolor="black",
                    linestyle="none", label=label)
            ax.annotate(f"{value:,}", (16, value), xytext=(8, -3), textcoords="offset points", fontsize=8)
        ax.set_title(f"{name}, 16 cores + GPU (0.1: lines; 0.3: large points)", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(n) for n in workers])
        ax.set_xlabel("decode workers N (16 cores)")
        ax.set_ylabel("samples/s")
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")


def draw_end_to_end(plt: Any, data: dict[str, Any]) -> Any:
    """Samples/s of a GPU training loop per loader (data wait on each bar), one panel per dataset; the step's
    own rate as a line."""
    rows = data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    y = list(range(len(rows)))[::-1]
    colors = [PEER if r["loader"].startswith("DataLoader") else OURS for r in rows]
    for ax, (key, title) in zip(axes, (("flac", "FLAC 44.1 kHz"), ("pcm16", "PCM16 32 kHz")), strict=True):
        bars = ax.barh(y, [r[key][0] for r in rows], color=colors)
        _bar_labels(ax, bars, [f"{r[key][0]:,}  (wait {r[key][1]:.1%})" for r in rows])
        ax.axvline(data["step_alone_samples_per_s"], color=CEILING, linestyle=":", linewidth=2,
                   label=f"the step alone: {data['step_alone_samples_per_s']:,}/s ({data['step_alone_ms']} ms)")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("samples/s (data wait: the loop's time in next())")
        ax.set_xlim(0, data["step_alone_samples_per_s"] * 1.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_yticks(y, [r["loader"] for r in rows], fontsize=8)
    fig.suptitle(data["title"], fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    _footnote(fig, data)
    return fig


def draw_speech_lhotse(plt: Any, data: dict[str, Any]) -> Any:
    """Four panels (audio s/s, first batch, peak PSS, padding efficiency), grouped by corpus."""
    rows = data["rows"]
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    colors = {name: OURS if name == "audioloader" else PEER for name in contenders}
    metrics = [("audio_s_per_s", "audio seconds per second (higher is better)", "{:.0f}"),
               ("first_batch_s", "first batch, s (lower is better)", "{:.2f}"),
               ("peak_pss_mb", "peak PSS, MB (lower is better)", "{:.0f}"),
               ("padding_efficiency", "padding efficiency (higher is better)", "{:.3f}")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    width = 0.8 / len(contenders)
    for ax, (key, title, fmt) in zip(axes.flat, metrics, strict=True):
        for k, name in enumerate(contenders):
            values = [next(r[key] for r in rows if r["corpus"] == c and r["contender"] == name) for c in corpora]
            xs = [i + (k - (len(contenders) - 1) / 2) * width for i in range(len(corpora))]
            bars = ax.bar(xs, values, width, color=colors[name], label=name)
            _column_labels(ax, bars, [fmt.format(value) for value in values])
        ax.set_xticks(range(len(corpora)), corpora, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.margins(y=0.15)
    # Above the panels: inside one, a legend covers the label of a bar as tall as the axes (the 60-utterance one).
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(names), fontsize=8,
               frameon=False)
    fig.suptitle("Speech: 80-bin fbank, 200 s bucketed batches, 2 workers; audioloader vs Lhotse", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.94))
    _footnote(fig, data)
    return fig


def draw_remote(plt: Any, data: dict[str, Any]) -> Any:
    """Samples/s local vs S3 per format and buffer, and the first batch with raw rows."""
    rows = data["rows"]
    labels = [f"{r['format']}\n{r['buffer']}" for r in rows]
    fig, (rate, first) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [2, 1]})
    xs = range(len(rows))
    for offset, key, name, color in ((-0.2, "local_samples_per_s", "local disk", PEER),
                                     (0.2, "s3_samples_per_s", "S3 (moto, loopback)", OURS)):
        bars = rate.bar([x + offset for x in xs], [r[key] for r in rows], 0.4, color=color, label=name)
        _column_labels(rate, bars, [f"{r[key]}" for r in rows])
    rate.set_xticks(list(xs), labels, fontsize=8)
    rate.set_ylabel("samples/s")
    rate.legend(fontsize=8)
    timed = [r for r in rows if r["local_first_batch_s"] is not None]
    for offset, key, color in ((-0.2, "local_first_batch_s", PEER), (0.2, "s3_first_batch_s", OURS)):
        bars = first.bar([x + offset for x in range(len(timed))], [r[key] for r in timed], 0.4, color=color)
        _column_labels(first, bars, [f"{r[key]:.2f}" for r in timed])
    first.set_xticks(range(len(timed)), [f"{r['format']}\n{r['buffer']}" for r in timed], fontsize=8)
    first.set_ylabel("first batch, s")
    fig.suptitle("Shards on local disk vs on S3 (a loopback server: request pattern, not S3's latency)", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    _footnote(fig, data)
    return fig


#: How each peer of the remote-latency chart is drawn: grey, a marker of its own, named in the legend (not on the
#: panel, where two peers at almost the same rate put their labels on top of each other), and moved a few ms
#: aside (all ran at 50 ms) so that two peers at the same rate stay two markers.
PEER_MARKERS = {"litdata": ("LitData", "x", -3.0), "streaming": ("MosaicML Streaming", "+", 3.0),
                "s3fs": ("s3fs", "v", 0.0)}


def draw_remote_latency(plt: Any, data: dict[str, Any]) -> Any:
    """Samples/s against the added latency a request (0-100 ms) per training loader and format, local disk as a
    dashed line, the peers at their one latency as grey markers; one legend for all panels."""
    panels = sorted({(r["dataset"], r["contender"]) for r in data["rows"] if r["project"] is not None})
    columns = 2 if len(panels) > 2 else len(panels)
    rows_of_panels = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(11, 3.6 * rows_of_panels + 1.4), squeeze=False)
    legend: dict[str, Any] = {}
    for ax, (dataset, contender) in zip(axes.flat, panels, strict=False):
        features = contender.split("-")[-1]
        for fmt, style, color in (("ipc", "o-", OURS), ("parquet", "s-", OTHER)):
            runs = [r for r in data["rows"] if (r["dataset"], r["contender"], r["format"]) == (dataset, contender, fmt)]
            remote = sorted((r["latency_ms"], r["samples_per_s"]) for r in runs if r["latency_ms"] is not None)
            local = [r["samples_per_s"] for r in runs if r["latency_ms"] is None]
            name = f"audioloader, {fmt}"
            legend[name] = ax.plot([x for x, _ in remote], [y for _, y in remote], style, color=color, label=name)[0]
            if local:
                name = f"{fmt}, local disk"
                legend[name] = ax.axhline(local[0], color=color, linestyle="--", linewidth=1, label=name)
        for r in data["rows"]:
            if r["project"] is None and r["dataset"] == dataset and r["contender"] == contender:
                name, marker, aside = PEER_MARKERS.get(r["peer"], (r["peer"], "D", 0.0))
                name = f"{name} ({r['latency_ms']:.0f} ms)"
                legend[name] = ax.plot([r["latency_ms"] + aside], [r["samples_per_s"]], marker, markersize=9,
                                       color=PEER, markeredgewidth=2, linestyle="none", clip_on=False, label=name)[0]
        ax.set_title(f"{dataset} rows, training, {features}", fontsize=10)
        ax.set_xlabel("added latency a request, ms")
        ax.set_ylabel("samples/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Training from S3 (moto + shaping proxy, 50 MB/s a connection) against local disk", fontsize=11)
    fig.legend(list(legend.values()), list(legend), loc="upper center", bbox_to_anchor=(0.5, 0.955),
               ncol=(len(legend) + 1) // 2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.93))
    _footnote(fig, data)
    return fig


def remote_latency_data(results: dict[str, Any], command: str, date: str) -> dict[str, Any]:
    """The ``remote_latency`` chart's numbers from a `benchmarks/remote/bench_remote.py` JSON output: the training
    loaders and the peers (samples/s after the first batch)."""
    rows = []
    for r in results["results"]:
        # A peer's contender is its name (litdata, ...); the loader it stands against is in the run's name.
        contender = r["name"].split(":", 1)[1].split()[0] if r["project"] is None else r["contender"]
        if contender in ("train-waveform", "train-mel") and r.get("samples_per_s"):
            peer = r["contender"] if r["project"] is None else None
            rows.append({"project": r["project"], "peer": peer, "contender": contender,
                         "dataset": r["dataset"], "format": r.get("format"), "latency_ms": r["latency_ms"],
                         "samples_per_s": round(r["samples_per_s"], 1)})
    commits = {name: p.get("commit") for name, p in results.get("projects", {}).items()}
    return {"title": "Training samples/s from S3 at 0-100 ms a request, local disk and the peers",
            "command": command, "date": date, "commit": commit_text(commits),
            "machine": f"{results['machine']['cores']} cores; moto and the proxy share them (a stand-in for S3's "
                       "protocol and latency, not its capacity)", "rows": rows}


def draw_batching(plt: Any, data: dict[str, Any]) -> Any:
    """Two panels: each contender's efficiency (useful work / the 8 ranks' budgeted work) with its steps a pass,
    and the batch size `tune_batch_sizes` chose for each bucket beside the largest that fits."""
    rows, buckets = data["rows"], data["buckets"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.1, 1]})
    names = [r["contender"] for r in rows]
    bars = left.barh(range(len(rows)), [r["efficiency"] for r in rows],
                     color=[OURS if r["ours"] else PEER for r in rows])
    _bar_labels(left, bars, [f"{r['efficiency']:.3f}, {r['steps']} steps" for r in rows])
    left.set_yticks(range(len(rows)), names, fontsize=8)
    left.set_xlabel("efficiency: useful work / (8 × the slowest rank's cost), higher is better", fontsize=8)
    left.margins(x=0.3)
    tuned, fits = buckets["tuned"], buckets["largest_that_fits"]
    xs = range(len(tuned))
    right.bar([x - 0.2 for x in xs], fits, 0.4, color=CEILING, label="largest batch that fits")
    right.bar([x + 0.2 for x in xs], tuned, 0.4, color=OURS, label="tune_batch_sizes (margin 0.05)")
    right.set_xlabel(f"bucket ({buckets['duration_buckets']} duration × {buckets['token_buckets']} tokens-per-second, "
                     "shortest first)", fontsize=8)
    right.set_ylabel("rows a batch", fontsize=8)
    right.legend(fontsize=8, frameon=False)
    fig.suptitle(data["title"], fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    _footnote(fig, data)
    return fig


DRAW: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "peers": draw_peers, "scaling": draw_scaling, "speech_lhotse": draw_speech_lhotse, "remote": draw_remote,
    "remote_latency": draw_remote_latency, "end_to_end": draw_end_to_end, "batching": draw_batching}


def draw(name: str, data_dir: Path = DATA, out_dir: Path = OUT) -> Path:
    """Draw ``out_dir/name.png`` from ``data_dir/name.json``, with the JSON's digest in its metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data_file = data_dir / f"{name}.json"
    fig = DRAW[name](plt, json.loads(data_file.read_text(encoding="utf-8")))
    out = out_dir / f"{name}.png"
    # No "Software" entry: the PNG then depends on the numbers and the code, not on the matplotlib version's name.
    fig.savefig(out, dpi=100, metadata={DIGEST_KEY: digest(data_file), "Software": None})
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a chart or a number in the docs differs from its data; change nothing")
    parser.add_argument("--force", action="store_true", help="draw every chart, current or not")
    parser.add_argument("--data", type=Path, default=DATA, help=f"folder of the JSON numbers (default {DATA})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder of the charts (default {OUT})")
    parser.add_argument("--numbers", type=Path, default=NUMBERS,
                        help=f"folder of the numbers the docs quote that have no chart (default {NUMBERS})")
    parser.add_argument("--pages", type=Path, nargs="+", default=doc_numbers.PAGES,
                        help="the Markdown pages whose numbers are checked or rewritten (default README.md, docs/*.md)")
    parser.add_argument("--from-bench-remote", nargs=3, metavar=("JSON", "COMMAND", "DATE"),
                        help="write data/remote_latency.json from bench_remote's JSON output, then draw")
    args = parser.parse_args(argv)
    if args.from_bench_remote:
        source, command, date = args.from_bench_remote
        numbers = remote_latency_data(json.loads(Path(source).read_text(encoding="utf-8")), command, date)
        (args.data / "remote_latency.json").write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    problems = stale(args.data, args.out)
    if args.check:
        numbers_problems = doc_numbers.stale_numbers(args.pages, [args.data, args.numbers])
        for problem in problems + numbers_problems:
            print(problem, file=sys.stderr)
        if problems or numbers_problems:
            print("charts or numbers are stale: run `python -m benchmarks.figures` (charts need matplotlib: "
                  "pip install -e '.[docs]')", file=sys.stderr)
            return 1
        spans = sum(len(doc_numbers.spans(page)) for page in args.pages)
        print(f"{len(list(args.data.glob('*.json')))} charts and {spans} numbers in the docs match their data")
        return 0
    names = sorted(p.stem for p in args.data.glob("*.json") if p.stem in DRAW)
    todo = names if args.force else [n for n in names if any(str(args.out / f"{n}.png") in p for p in problems)]
    for name in todo:
        print(f"drew {draw(name, args.data, args.out)}")
    if not todo:
        print("every chart matches its numbers")
    for page in doc_numbers.update_numbers(args.pages, [args.data, args.numbers]):
        print(f"rewrote the numbers of {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
