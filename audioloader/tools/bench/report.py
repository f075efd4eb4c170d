"""Ratios, targets and the printed report of ``audioloader bench``."""

from __future__ import annotations

import statistics
from typing import Any

from .settings import DISTURBED_CORES, TARGETS

# -- ratios and targets ------------------------------------------------------------------------------------


def rate_of(results: dict[str, Any], name: str) -> float | None:
    r = results.get(name) or {}
    return r.get("samples_per_s") if r.get("ok") else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _ratio(results: dict[str, Any], a: str, b: str, key: str = "samples_per_s") -> float | None:
    """``a / b`` of ``key``; with several rounds, the median of the per-round ratios (robust to drift)."""
    ra, rb = results.get(a) or {}, results.get(b) or {}
    if not (ra.get("ok") and rb.get("ok")):
        return None
    rounds_key = {"samples_per_s": "rounds_samples_per_s", "first_batch_s": "rounds_first_batch_s"}.get(key)
    xs, ys = ra.get(rounds_key) if rounds_key else None, rb.get(rounds_key) if rounds_key else None
    if xs and ys and len(xs) == len(ys):
        per_round = [x / y for x, y in zip(xs, ys, strict=True) if x is not None and y]
        if per_round:
            return statistics.median(per_round)
    return _div(ra.get(key), rb.get(key))


def ratios_of(out: dict[str, Any]) -> dict[str, float | None]:
    """Every contender against the user baseline, the ceiling (of the same shards), and its plain self (variants)."""
    c = out["contenders"]
    w = out["target_workers"]
    ratios: dict[str, float | None] = {}
    for name in c:
        if not name.startswith("ceiling"):
            ratios[f"{name} / baseline-torchaudio"] = _ratio(c, name, "baseline-torchaudio")
    for name in c:
        if name.startswith("audioloader-train"):
            codec = next((k for k in ("flac", "pcm16") if f"-packed-{k}-" in name), None)
            ceiling = f"ceiling-packed-{codec}" if codec else "ceiling"
            ratios[f"{name} / {ceiling}"] = _ratio(c, name, ceiling)
            ratios[f"{name} per CPU-s / {ceiling}'s"] = _ratio(c, name, ceiling, "samples_per_cpu_s")
    for name in c:
        if "+" in name:
            base = name.split("+")[0]
            if base in c:
                ratios[f"{name} / {base}"] = _ratio(c, name, base)
    ratios["baseline-soxr / baseline-torchaudio"] = _ratio(c, "baseline-soxr", "baseline-torchaudio")
    for name in c:
        if name.startswith("audioloader-eval"):
            ratios[f"{name} first batch / baseline's"] = _ratio(c, name, "baseline-torchaudio", "first_batch_s")
    for name in (f"audioloader-train-w{w}", *(n for n in c if n.startswith("audioloader-eval") and "+" not in n),
                 *(n for n in c if n.startswith("audioloader-train") and "+" in n)):
        if name in c:
            ratios[f"{name} peak PSS / baseline's"] = _ratio(c, name, "baseline-torchaudio", "peak_pss_bytes")
            ratios[f"{name} peak RSS / baseline's"] = _ratio(c, name, "baseline-torchaudio", "peak_rss_bytes")
            ratios[f"{name} peak anon RSS / baseline's"] = _ratio(c, name, "baseline-torchaudio",
                                                                  "peak_rss_anon_bytes")
    return ratios


def targets_of(out: dict[str, Any]) -> list[dict[str, Any]]:
    c, w, ratios = out["contenders"], out["target_workers"], out["ratios"]
    eval_name = next((n for n in c if n.startswith("audioloader-eval") and "+" not in n), "audioloader-eval")
    train = f"audioloader-train-w{w}"
    values: dict[str, tuple[float | None, str]] = {
        "throughput_vs_baseline": (ratios.get(f"{train} / baseline-torchaudio"), f"{train} vs baseline-torchaudio"),
        "packed_flac_vs_baseline": (ratios.get(f"audioloader-train-packed-flac-w{w} / baseline-torchaudio"),
                                    f"audioloader-train-packed-flac-w{w} vs baseline-torchaudio"),
        "packed_pcm16_vs_baseline": (ratios.get(f"audioloader-train-packed-pcm16-w{w} / baseline-torchaudio"),
                                     f"audioloader-train-packed-pcm16-w{w} vs baseline-torchaudio"),
        "throughput_vs_ceiling": (ratios.get(f"{train} / ceiling"), f"{train} vs ceiling"),
        "first_batch_eval_vs_baseline": (ratios.get(f"{eval_name} first batch / baseline's"),
                                         f"{eval_name} vs baseline-torchaudio"),
        "peak_memory_vs_baseline": (ratios.get(f"{train} peak PSS / baseline's"),
                                    f"{train} vs baseline-torchaudio (PSS of the process tree)"),
    }
    at_10000 = [r["checkpoint_bytes"] for r in out["resume"].values() if r.get("buffer") == 10000
                and r.get("checkpoint_bytes") is not None]
    detail = "largest of decode-shuffle and shuffle-decode at buffer 10000"
    if not at_10000:
        detail = "buffer 10000 not run (" + _checkpoint_projection(out["resume"]) + ")"
    values["checkpoint_bytes_10000"] = (max(at_10000) if at_10000 else None, detail)
    targets = []
    for name, (what, op, threshold) in TARGETS.items():
        value, detail = values[name]
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        targets.append({"name": name, "description": what, "op": op, "threshold": threshold, "value": value,
                        "met": met, "detail": detail})
    return targets


def _checkpoint_projection(resume: dict[str, dict[str, Any]]) -> str:
    """A linear fit of checkpoint bytes against buffer size, projected to 10000 (needs two buffer sizes)."""
    by_buffer: dict[int, int] = {}
    for r in resume.values():
        if r.get("checkpoint_bytes"):
            by_buffer[r["buffer"]] = max(r["checkpoint_bytes"], by_buffer.get(r["buffer"], 0))
    if len(by_buffer) < 2:
        return "no projection: fewer than two buffer sizes"
    (b0, s0), (b1, s1) = sorted(by_buffer.items())[0], sorted(by_buffer.items())[-1]
    projected = s0 + (s1 - s0) * (10000 - b0) / (b1 - b0)
    return f"projected {projected / 1024:.0f} KiB from buffers {b0} and {b1}"


# -- printing ----------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{suffix}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _by_process(r: dict[str, Any]) -> str:
    """`` (main 400 + 2 children 310, 305)``: the peak PSS of each process of the tree, MiB."""
    each = r.get("peak_pss_by_process_bytes")
    if not each:
        return ""
    children = each.get("children") or []
    listed = ", ".join(_mib(b) for b in children)
    return f" (main {_mib(sum(each.get('main') or []))}" + (f" + {len(children)} children {listed})" if children
                                                           else ")")


def log_line(name: str, r: dict[str, Any], log) -> None:
    if not r.get("ok"):
        log(f"  {name}: FAILED: {r.get('error')}")
        return
    parts = []
    if r.get("samples_per_s") is not None:
        parts.append(f"{r['samples_per_s']:.1f} samples/s")
    if r.get("first_batch_s") is not None:
        parts.append(f"first batch {r['first_batch_s']:.2f} s")
    if r.get("restore_first_batch_s") is not None:
        parts.append(f"restore {r['restore_first_batch_s']:.2f} s, exact={r.get('exact')}")
    if r.get("checkpoint_bytes") is not None:
        parts.append(f"checkpoint {r['checkpoint_bytes'] / 1024:.1f} KiB")
    parts.append(f"peak PSS {_mib(r.get('peak_pss_bytes'))} MiB{_by_process(r)}, "
                 f"RSS {_mib(r.get('peak_rss_bytes'))} MiB")
    if r.get("others_cores") is not None:
        parts.append(f"others {r['others_cores']:.2f} cores")
    log(f"  {name}: " + ", ".join(parts))


def format_report(out: dict[str, Any]) -> str:
    """The human-readable report: setup, the throughput table, the resume table, the targets."""
    m, s, c, ratios = out["machine"], out["settings"], out["contenders"], out["ratios"]
    lines = [
        f"audioloader bench ({out['mode']}): {s['clips']} clips x {s['seconds']:g} s, "
        f"{s['sample_rate']} Hz {s['codec']} {s['channels']} ch; batch {s['batch_size']}; "
        f"train buffer {s['train_buffer']} / min fill {s['train_min']}; {s['repeat']} round(s)",
        f"machine: {m['cores']} cores ({m['cpu']}), python {m['python']}, torch {m['torch']}",
    ]
    train = c.get(f"audioloader-train-w{out['target_workers']}") or {}
    if train.get("shuffle_before_decode") is not None:
        lines.append(f"audioloader train composition (the default for these shards): shuffle_before_decode="
                     f"{train['shuffle_before_decode']}")
    lines.append("")
    header = ("contender", "samples/s", "x baseline", "x ceiling", "per CPU-s", "first batch s",
              "peak PSS MiB", "peak RSS MiB", "anon MiB", "cores used", "others")
    rows = []
    failures = []
    for name, r in c.items():
        if not r.get("ok"):
            rows.append((name, "FAILED", *[""] * 9))
            failures.append(f"  {name}: {r.get('error')}")
            continue
        ceiling = next((v for k, v in ratios.items() if k.startswith(f"{name} / ceiling")), None)
        rows.append((
            name, _fmt(r.get("samples_per_s"), ".1f"),
            _fmt(ratios.get(f"{name} / baseline-torchaudio"), ".2f", "x"),
            _fmt(ceiling, ".2f", "x"),
            _fmt(r.get("samples_per_cpu_s"), ".1f"),
            _fmt(r.get("first_batch_s"), ".2f"),
            _mib(r.get("peak_pss_bytes")), _mib(r.get("peak_rss_bytes")), _mib(r.get("peak_rss_anon_bytes")),
            _fmt(r.get("cores_used"), ".2f"),
            _fmt(r.get("others_cores"), ".2f") + (" !" if r.get("disturbed") else ""),
        ))
    lines += _table(header, rows)
    lines += failures
    by_process = [(name, r) for name, r in c.items() if r.get("ok") and _by_process(r)]
    if by_process:
        lines.append("  peak PSS by process, at the tree's peak (MiB): the contender's process and its children "
                     "(worker processes, a fork server):")
        lines += [f"    {name}: {_mib(r.get('peak_pss_bytes'))} ={_by_process(r)}" for name, r in by_process]
    lines.append("  ceiling = one-thread DecodeSpectrogram.decode() rate x cores, no framework (of the same shards); "
                 "per CPU-s = samples per CPU second of the process tree;")
    lines.append("  others = cores used by other processes meanwhile (! = disturbed: re-run)")
    variants = [(f"{name} / {name.split('+')[0]}", ratios.get(f"{name} / {name.split('+')[0]}"))
                for name in c if "+" in name and f"{name} / {name.split('+')[0]}" in ratios]
    if variants:
        lines += ["", "variants (--experiments), each against its plain self:"]
        for key, value in variants:
            name, base = key.split(" / ")
            r, b = c.get(name, {}), c.get(base, {})
            extra = []
            if r.get("first_batch_s") and b.get("first_batch_s"):
                extra.append(f"first batch {b['first_batch_s']:.2f} -> {r['first_batch_s']:.2f} s")
            if r.get("peak_rss_anon_bytes") and b.get("peak_rss_anon_bytes"):
                extra.append(f"anon RSS {_mib(b['peak_rss_anon_bytes'])} -> {_mib(r['peak_rss_anon_bytes'])} MiB")
            lines.append(f"  {name}: {_fmt(value, '.2f', 'x')} samples/s" + (f"; {', '.join(extra)}" if extra else ""))
    if out["resume"]:
        lines.append("")
        header = ("checkpoint/resume", "buffer", "checkpoint KiB", "fresh first batch s",
                  "load -> first batch s", "x fresh", "exact", "save anon MiB", "load anon MiB")
        rows, failures = [], []
        for name, r in out["resume"].items():
            if not r.get("ok"):
                rows.append((name, str(r.get("buffer", "")), "FAILED", *[""] * 6))
                failures.append(f"  {name}: {r.get('error')}")
                continue
            rows.append((name, str(r["buffer"]), _fmt(r["checkpoint_bytes"] / 1024, ".1f"),
                         _fmt(r["fresh_first_batch_s"], ".2f"), _fmt(r["restore_first_batch_s"], ".2f"),
                         _fmt(r.get("restore_vs_fresh"), ".2f", "x"), str(r["exact"]),
                         _mib(r.get("save_peak_rss_anon_bytes")), _mib(r.get("load_peak_rss_anon_bytes"))))
        lines += _table(header, rows)
        lines += failures
        lines.append("  decode-shuffle: the default chain (buffer of decoded spectrograms); shuffle-decode: "
                     "shuffle_before_decode=True (buffer of raw rows); min fill = capacity")
    lines += ["", "targets:"]
    for t in out["targets"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        value = t["value"]
        is_bytes = t["name"] == "checkpoint_bytes_10000"
        shown = "-" if value is None else f"{value / 1024:.1f} KiB" if is_bytes else f"{value:.2f}x"
        limit = f"{t['threshold'] / 1024:.0f} KiB" if is_bytes else f"{t['threshold']:g}x"
        lines.append(f"  [{verdict:^12}] {t['name']}: {shown} (target {t['op']} {limit}; {t['detail']})")
    # Why something was not measured (e.g. no torchaudio for the baseline), and how to fix it: one line each.
    lines += [f"  note: {note}" for note in out.get("notes", [])]
    if out["disturbed"]:
        lines.append("")
        lines.append(f"warning: other processes used > {DISTURBED_CORES} cores during: "
                     f"{', '.join(out['disturbed'])}; figures taken then are unreliable, re-run")
    lines.append(f"\n(decode workers of the targets and packed runs, the default here or else the fastest: "
                 f"{out['target_workers']}; total {out['seconds']['total']:.0f} s)")
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    def line(values):
        return "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True)))
    return [line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)]


