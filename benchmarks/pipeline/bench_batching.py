"""What each batch makes 8 data-parallel GPUs do: audioloader's bucketing against Lhotse's DynamicBucketingSampler.

Data (synthetic, seeded): ``--utterances`` (6,000) utterances, a LibriSpeech / Common Voice-like mix of 0.5-35 s
(60 % Common Voice-like: log-normal around 4.5 s, up to 12 s; 40 % LibriSpeech-like: around 12.5 s, up to 35 s),
about 3 tokens a second (log-normal spread of 15 %), 5 % dense outliers with 4-6 times as many. audioloader reads
them from an Arrow IPC shard (a tiny clip per row, the nominal ``duration`` and the ``tokens`` in columns: the
batches depend only on those); Lhotse gets the same durations as dummy cuts, in a virtual environment this script
creates (``lhotse==1.33``, see benchmarks/end_to_end/lhotse_env.py).

Cost model (an attention encoder and a text decoder, stated here, the same for every contender): a batch of ``B``
rows whose longest is ``L`` s and longest transcript ``T`` tokens costs and holds ``B·L·(1 + L/30) + 0.3·B·T``; the
memory budget is ``--budget`` (1,000) of those units, and a step also pays ``--overhead`` (50) units, so full
batches pay off. A row's useful work is ``d·(1 + d/30) + 0.3·t``. Over one pass on ``--ranks`` (8) ranks:

- efficiency = useful work (each utterance once) / (ranks × the sum over steps of the slowest rank's step cost), 1.0
  at best (a rank without a batch at a step waits for the others);
- steps per pass (the most any rank takes), padding (real seconds / padded seconds), batches over the budget.

Each contender's ``max_duration`` is tuned as a user does by trial and error: the largest value (bisection to
``--resolution`` s) with no batch over the budget in the pass. Contenders:

- ``lhotse``, ``lhotse-sync``, ``lhotse-sync-q30``: ``DynamicBucketingSampler(cuts, max_duration=tuned, shuffle=True,
  num_buckets=30, world_size=8, rank=r, sync_buckets=False/True[, quadratic_duration=30])`` (NeMo's options);
- ``al-0.3``: ``Bucketing(max_duration=tuned, sync_buckets=False)``, 0.3's bucketing;
- ``al-q30``: ``Bucketing(max_duration=tuned, quadratic_duration=30)`` (ranks in step, the default on 8 ranks);
- ``al-tuned``, ``al-tuned-apart``: ``al.tune_batch_sizes`` over 2-D buckets with ``Bucketing``'s defaults
  (``Bucketing(max_duration=al-0.3's, token_column="tokens")``: duration buckets fitted to a rank's pass, at most 8
  with 4 tokens-per-second buckets each; ``--al-buckets`` / ``--token-buckets`` set them) with a step that raises
  ``MemoryError`` above the budget (the CPU stand-in for a GPU's out-of-memory error), margin 0.05; in step / not.

Targets (issue 34, this run): ``al-tuned`` efficiency >= 1.25 × the best Lhotse contender, 0 batches over budget, and
>= 25 % fewer steps per pass than ``al-0.3``.

    python -m benchmarks.pipeline.bench_batching [--utterances 6000] [--ranks 8] [--output batching.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, module_command
from benchmarks.end_to_end.lhotse_env import lhotse_python

RATE = 8000
TARGETS = {"efficiency_vs_lhotse": 1.25, "over_budget": 0, "fewer_steps_vs_0_3": 0.25}


# ---------------------------------------------------------------------------------------------- data, cost model


def corpus(n: int, seed: int = 34) -> tuple[np.ndarray, np.ndarray]:
    """Durations (s) and token counts of ``n`` utterances (see the module doc)."""
    rng = np.random.default_rng(seed)
    common_voice = rng.random(n) < 0.6
    seconds = np.where(common_voice, np.exp(rng.normal(np.log(4.5), 0.45, n)), rng.normal(12.5, 5.0, n))
    seconds = np.round(np.clip(seconds, 0.5, np.where(common_voice, 12.0, 35.0)), 3)
    dense = rng.random(n) < 0.05
    rate = 3.0 * np.exp(rng.normal(0.0, 0.15, n)) * np.where(dense, rng.uniform(4.0, 6.0, n), 1.0)
    tokens = np.maximum(1, np.round(seconds * rate)).astype(np.int64)
    return seconds, tokens


class Cost:
    """The stated cost model over the corpus's rows (see the module doc)."""

    def __init__(self, seconds: np.ndarray, tokens: np.ndarray, budget: float, overhead: float) -> None:
        self.seconds, self.tokens, self.budget, self.overhead = seconds, tokens, budget, overhead

    def batch(self, rows: list[int]) -> float:
        longest, tokens = float(self.seconds[rows].max()), float(self.tokens[rows].max())
        return len(rows) * longest * (1 + longest / 30) + 0.3 * len(rows) * tokens

    def useful(self, rows: list[int]) -> float:
        d, t = self.seconds[rows], self.tokens[rows]
        return float((d * (1 + d / 30) + 0.3 * t).sum())

    def over(self, ranks: list[list[list[int]]]) -> int:
        return sum(self.batch(b) > self.budget for batches in ranks for b in batches)

    def report(self, ranks: list[list[list[int]]]) -> dict:
        """Efficiency, steps, padding and batches over the budget of one pass (each rank's batches, in order)."""
        steps = max(len(batches) for batches in ranks)
        paid = sum(max(self.batch(batches[s]) + self.overhead for batches in ranks if s < len(batches))
                   for s in range(steps))
        rows = [i for batches in ranks for b in batches for i in b]
        padded = sum(len(b) * float(self.seconds[b].max()) for batches in ranks for b in batches)
        # Useful work counts each utterance once: a copy a sampler adds to even out ranks is paid, not useful.
        return {"efficiency": self.useful(sorted(set(rows))) / (len(ranks) * paid), "steps": steps,
                "padding": float(self.seconds[rows].sum()) / padded, "over_budget": self.over(ranks),
                "rows": len(rows), "distinct_rows": len(set(rows)), "batches": sum(len(b) for b in ranks),
                "mean_batch_cost": float(np.mean([self.batch(b) for batches in ranks for b in batches]))}


def tune_max_duration(run, cost: Cost, low: float, high: float, resolution: float) -> tuple[float, list]:
    """The largest ``max_duration`` in [low, high] whose pass has no batch over the budget (bisection, as a user
    tries values), and that pass."""
    best = None
    while high - low > resolution:
        middle = (low + high) / 2
        ranks = run(middle)
        if cost.over(ranks) == 0:
            low, best = middle, (middle, ranks)
        else:
            high = middle
    return best if best is not None else (low, run(low))


# ---------------------------------------------------------------------------------------------- audioloader


def write_shard(folder: Path, seconds: np.ndarray, tokens: np.ndarray) -> Path:
    """One Arrow IPC shard: a 20 ms WAV clip per row, its nominal ``duration`` and its ``tokens``."""
    import io

    import pyarrow as pa
    import soundfile as sf

    path = folder / "speech.arrow"
    if path.exists():
        return folder
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(RATE // 50, dtype=np.float32), RATE, format="WAV", subtype="PCM_16")
    clip = buffer.getvalue()
    table = pa.table({"audio": pa.array([clip] * len(seconds), pa.binary()),
                      "duration": pa.array(seconds, pa.float64()), "tokens": pa.array(tokens, pa.int64())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=100):
            writer.write_batch(batch)
    return folder


def loader_options(rank: int, ranks: int) -> dict:
    import audioloader as al

    return {"train": True, "infinite": False, "seed": 0, "features": al.WaveformConfig(sample_rate=RATE),
            "length": al.LengthPolicy(crop=None), "workers": al.Workers(num_workers=0),
            "storage": al.Storage(rank=rank, world_size=ranks, split_rows=50)}


def run_audioloader(folder: Path, bucketing, ranks: int, full: bool = False) -> list[list[list[int]]]:
    """Each rank's batches (global indices) of one training pass: from the bucketer (the batches the loader
    decodes), or, ``full``, from the whole loader."""
    import audioloader as al
    from audioloader.samples import BatchEnd

    out = []
    for rank in range(ranks):
        with al.AudioLoader(al.Source(folder, label_column=None), batching=bucketing,
                            **loader_options(rank, ranks)) as loader:
            if full:  # the rank's own batches (a rank that runs out pads with one-entry batches, valid False)
                out.append([batch["index"][batch["valid"]].tolist() if "valid" in batch else batch["index"].tolist()
                            for batch in loader if "valid" not in batch or batch["valid"].any()])
                continue
            bucketer, batches, current = loader._chain.bucketer, [], []
            bucketer.reset(None)
            for item in bucketer:
                if isinstance(item, BatchEnd):
                    batches.append(current)
                    current = []
                else:
                    current.append(item.key.index)
            out.append(batches)
    return out


def tuned_bucketing(folder: Path, cost: Cost, buckets: int, token_buckets: int, max_duration: float):
    """``tune_batch_sizes`` over 2-D buckets, with a step that runs out of memory above the budget."""
    import audioloader as al

    def step(batch):
        if cost.batch(batch["index"].tolist()) > cost.budget:
            raise MemoryError("over the budget")

    start = time.perf_counter()
    bucketing = al.Bucketing(max_duration=max_duration, num_buckets=buckets, token_column="tokens",
                             token_buckets=token_buckets)
    options = {k: v for k, v in loader_options(0, 1).items() if k not in ("train", "infinite", "workers")}
    tuned = al.tune_batch_sizes(al.Source(folder, label_column=None), bucketing, step, margin=0.05, **options)
    return tuned, time.perf_counter() - start


def fitting_sizes(folder: Path, tuned, cost: Cost) -> list[int]:
    """The largest batch of each bucket that fits, from every row: its longest row and its longest transcript."""
    from audioloader.nodes.bucket_rules import BucketLimits

    limits = BucketLimits(None, tuned.boundaries, token_column="tokens", token_boundaries=tuned.token_boundaries,
                          batch_sizes=tuned.batch_sizes)
    which = np.array([limits.bucket_of(s, t) for s, t in zip(cost.seconds, cost.tokens, strict=True)])
    sizes = []
    for b in range(limits.count):
        rows = np.flatnonzero(which == b)
        if not len(rows):
            sizes.append(0)
            continue
        longest, dense = float(cost.seconds[rows].max()), float(cost.tokens[rows].max())
        sizes.append(int(cost.budget // (longest * (1 + longest / 30) + 0.3 * dense)))
    return sizes


# ---------------------------------------------------------------------------------------------- Lhotse


def lhotse_child(spec: dict) -> dict:
    """In Lhotse's venv: ``max_duration`` tuned (`tune_max_duration`) and each rank's batches (indices) of that
    pass."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=d, recording_duration=d) for i, d in enumerate(spec["seconds"]))
    index = {cut.id: i for i, cut in enumerate(cuts)}
    cost = Cost(np.asarray(spec["seconds"]), np.asarray(spec["tokens"]), spec["budget"], spec["overhead"])

    def run(max_duration: float) -> list[list[list[int]]]:
        ranks = []
        for rank in range(spec["ranks"]):
            sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, shuffle=True, drop_last=False,
                                              num_buckets=30, world_size=spec["ranks"], rank=rank, seed=0,
                                              sync_buckets=spec["sync"], quadratic_duration=spec["quadratic"])
            sampler.set_epoch(0)
            # With world_size, Lhotse evens out the ranks' batch counts with copies of cuts ("<id>_dup<k>").
            ranks.append([[index[c.id.split("_dup")[0]] for c in batch] for batch in sampler])
        return ranks

    tuned, ranks = tune_max_duration(run, cost, spec["low"], spec["high"], spec["resolution"])
    return {"max_duration": tuned, "ranks": ranks}


def run_lhotse(python: str, cost: Cost, ranks: int, sync: bool, quadratic: float | None, low: float, high: float,
               resolution: float) -> tuple[float, list]:
    """Lhotse's tuned ``max_duration`` and its pass, from a child process in its venv."""
    spec = {"seconds": cost.seconds.tolist(), "tokens": cost.tokens.tolist(), "budget": cost.budget,
            "overhead": cost.overhead, "ranks": ranks, "sync": sync, "quadratic": quadratic, "low": low,
            "high": high, "resolution": resolution}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        done = subprocess.run(module_command(__spec__, "--lhotse-child", f.name, python=python), cwd=ROOT,
                              capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if done.returncode:
        raise RuntimeError(f"Lhotse's child failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["max_duration"], out["ranks"]


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--utterances", type=int, default=6000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--budget", type=float, default=1000.0)
    parser.add_argument("--overhead", type=float, default=50.0)
    parser.add_argument("--resolution", type=float, default=2.0, help="max_duration tuning resolution, s")
    parser.add_argument("--high", type=float, default=600.0, help="the largest max_duration tried, s")
    parser.add_argument("--al-buckets", type=int, default=None,
                        help="duration buckets of the tuned 2-D grid (default: fitted, as Bucketing does)")
    parser.add_argument("--token-buckets", type=int, default=None,
                        help="tokens-per-second buckets per duration bucket (default: Bucketing's, 4)")
    parser.add_argument("--contenders", nargs="+", default=None)
    parser.add_argument("--cache-dir", default=".cache/bench")
    parser.add_argument("--output", default=None)
    parser.add_argument("--lhotse-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lhotse_child:
        print(json.dumps(lhotse_child(json.loads(Path(args.lhotse_child).read_text()))))
        return

    import audioloader as al

    cache = Path(args.cache_dir).resolve()
    seconds, tokens = corpus(args.utterances)
    cost = Cost(seconds, tokens, args.budget, args.overhead)
    folder = Path(cache, f"batching-n{args.utterances}-v1")
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder, seconds, tokens)
    print(f"{args.utterances} utterances, {seconds.sum() / 3600:.1f} h, {seconds.min():.1f}-{seconds.max():.1f} s, "
          f"{args.ranks} ranks, budget {args.budget:g}, overhead {args.overhead:g} a step", flush=True)
    low, high = float(seconds.max()), args.high
    contenders = {
        "lhotse": ("lhotse", False, None), "lhotse-sync": ("lhotse", True, None),
        "lhotse-sync-q30": ("lhotse", True, 30.0),
        "al-0.3": ("al", False, None), "al-q30": ("al", None, 30.0),
        "al-tuned": ("tuned", None, None), "al-tuned-apart": ("tuned", False, None),
    }
    wanted = args.contenders or list(contenders)
    python = lhotse_python(cache) if any(contenders[c][0] == "lhotse" for c in wanted) else None
    results: dict[str, dict] = {}
    tuned = None
    for name in wanted:
        kind, sync, quadratic = contenders[name]
        start = time.perf_counter()
        if kind == "lhotse":
            tuned_max, ranks = run_lhotse(python, cost, args.ranks, sync, quadratic, low, high, args.resolution)
            setting = {"max_duration": round(tuned_max, 2)}
        elif kind == "al":
            def run(max_duration, sync=sync, quadratic=quadratic):
                return run_audioloader(folder, al.Bucketing(max_duration=max_duration, quadratic_duration=quadratic,
                                                            sync_buckets=sync), args.ranks)

            tuned_max, ranks = tune_max_duration(run, cost, low, high, args.resolution)
            setting = {"max_duration": round(tuned_max, 2)}
        else:
            if tuned is None:
                base = results.get("al-0.3", {}).get("setting", {}).get("max_duration", 120.0)
                tuned, tuner_seconds = tuned_bucketing(folder, cost, args.al_buckets, args.token_buckets, base)
                fitting = fitting_sizes(folder, tuned, cost)
                print(f"  tune_batch_sizes: {tuner_seconds:.1f} s; sizes {list(tuned.batch_sizes)}; largest that "
                      f"fit (every row) {fitting}", flush=True)
            bucketing = al.Bucketing(**{**tuned.__dict__, "sync_buckets": sync})
            ranks = run_audioloader(folder, bucketing, args.ranks)
            if sync is None:  # the whole loader, decode included, makes the same batches
                assert run_audioloader(folder, bucketing, args.ranks, full=True) == ranks
            within = [s / f for s, f in zip(tuned.batch_sizes, fitting, strict=True) if f]
            setting = {"batch_sizes": list(tuned.batch_sizes), "largest_fitting": fitting,
                       "boundaries": list(tuned.boundaries), "token_boundaries": [list(r) for r in
                                                                                  tuned.token_boundaries],
                       "size_over_largest_fitting": [round(min(within), 3), round(max(within), 3)]}
        report = {**cost.report(ranks), "setting": setting, "seconds": round(time.perf_counter() - start, 1)}
        results[name] = report
        print(f"{name:16s} efficiency {report['efficiency']:.3f}  steps {report['steps']:4d}  padding "
              f"{report['padding']:.3f}  over budget {report['over_budget']}  rows {report['rows']} "
              f"({report['distinct_rows']} distinct)  {setting if 'batch_sizes' not in setting else ''}", flush=True)
    summary = targets(results)
    for line in summary["lines"]:
        print(line)
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "results": results, "targets": summary},
                                                indent=1))


def targets(results: dict) -> dict:
    lines, met = [], {}
    lhotse = [r["efficiency"] for n, r in results.items() if n.startswith("lhotse")]
    if "al-tuned" in results and lhotse:
        ratio = results["al-tuned"]["efficiency"] / max(lhotse)
        met["efficiency_vs_lhotse"] = ratio
        lines.append(f"al-tuned efficiency / best Lhotse: {ratio:.3f} (target >= {TARGETS['efficiency_vs_lhotse']})")
        lines.append(f"al-tuned batches over budget: {results['al-tuned']['over_budget']} (target 0)")
    if "al-tuned" in results and "al-0.3" in results:
        fewer = 1 - results["al-tuned"]["steps"] / results["al-0.3"]["steps"]
        met["fewer_steps_vs_0_3"] = fewer
        lines.append(f"al-tuned steps vs al-0.3: {fewer:.1%} fewer (target >= 25 %)")
    return {"lines": lines, "values": met}


if __name__ == "__main__":
    main()
