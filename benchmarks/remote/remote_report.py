"""Ratios, issue 19's targets and the printed tables of benchmarks/remote/bench_remote.py.

Every ratio is taken within one run: a remote figure against the same contender
(same project, dataset, format) on local disk; the reader also against its own
0 ms figure; the peers against audioloader's training loader with the same
features, dataset and latency.
"""

from __future__ import annotations

from typing import Any

LOADERS = ("eval-waveform", "train-waveform", "eval-mel", "train-mel")


def rate(r: dict[str, Any]) -> float | None:
    """Rows/s (reader) or samples/s after the first batch; None for a failed run."""
    if not r.get("ok"):
        return None
    return r.get("rows_per_s") if r["contender"] == "reader" else r.get("samples_per_s")


def _ms(latency: float | None) -> str:
    return "local" if latency is None else f"{latency:g}ms"


def _key(r: dict[str, Any]) -> str:
    return f"{r['project']}:{r['contender']} {r['dataset']}/{r['format']} {_ms(r['latency_ms'])}"


def _find(results: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((r for r in results if all(r.get(k) == v for k, v in match.items())), None)


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def construct_requests(r: dict[str, Any]) -> int | None:
    """Requests made while constructing (up to the child's "constructed" mark), or None if not marked."""
    marked = (r.get("marks") or {}).get("constructed")
    return marked["requests"] if marked else None


def ratios(results: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for r in results:
        if r["project"] is None or r["latency_ms"] is None or r["contender"].startswith("construct"):
            continue
        same = {"project": r["project"], "contender": r["contender"], "dataset": r["dataset"], "format": r["format"]}
        local = _find(results, **same, latency_ms=None)
        if local:
            out[f"{_key(r)} / local"] = _div(rate(r), rate(local))
            out[f"{_key(r)} first batch / local's"] = _div(r.get("first_batch_s", r.get("first_row_s")),
                                                           local.get("first_batch_s", local.get("first_row_s")))
        zero = _find(results, **same, latency_ms=0.0)
        if r["contender"] == "reader" and zero and r["latency_ms"]:
            out[f"{_key(r)} / 0ms"] = _div(rate(r), rate(zero))
    for r in results:
        if r["project"] is not None:
            continue  # a peer: audioloader's training loader with its features, dataset and latency against it
        for ours in results:
            if (ours["project"] is not None and ours["contender"] == f"train-{r['feature']}"
                    and ours["dataset"] == r["dataset"] and ours["latency_ms"] == r["latency_ms"]):
                out[f"{_key(ours)} / {r['contender']}"] = _div(rate(ours), rate(r))
    return out


def _target(what: str, value: float | None, comparison: str, threshold: float) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if comparison == ">=" else value <= threshold)
    return {"target": what, "value": value, "comparison": comparison, "threshold": threshold, "met": met}


def targets(results: list[dict[str, Any]], ratio: dict[str, float | None]) -> list[dict[str, Any]]:
    """Issue 19's targets, one line per figure they apply to (None where the run did not measure it)."""
    out = []
    for r in results:
        if r["project"] is None or r["latency_ms"] not in (50.0, 100.0):
            continue
        key, c = _key(r), r["contender"]
        if c in LOADERS:
            out.append(_target(f"{key}: rate / local", ratio.get(f"{key} / local"), ">=", 0.9))
            local = _find(results, project=r["project"], contender=c, dataset=r["dataset"], format=r["format"],
                          latency_ms=None)
            if local and local.get("first_batch_s") is not None:
                out.append(_target(f"{key}: first batch s (<= 2x local's + 0.5)", r.get("first_batch_s"), "<=",
                                   2 * local["first_batch_s"] + 0.5))
        elif c == "reader" and r["latency_ms"] == 50.0:
            out.append(_target(f"{key}: rows/s / its 0 ms rows/s", ratio.get(f"{key} / 0ms"), ">=", 0.9))
            if r["dataset"] == "speech":
                out.append(_target(f"{key}: rows/s", rate(r), ">=", 3500))
        elif c == "construct-cold" and r["latency_ms"] == 50.0:
            key = f"{key} ({r.get('files')} files)"
            if (r.get("files") or 0) >= 1000:  # the target is for 1,000 files; fewer would pass by size
                out.append(_target(f"{key}: construct s", r.get("construct_s") if r.get("ok") else None, "<=", 3.0))
            out.append(_target(f"{key}: construction requests per file", _div(construct_requests(r), r.get("files")),
                               "<=", 1.0))
            resumed = _find(results, project=r["project"], contender="construct-resume", latency_ms=50.0)
            if resumed and resumed.get("ok"):
                out.append(_target(f"{key}: resume construct s / cold's", _div(resumed.get("construct_s"),
                                                                              r.get("construct_s")), "<=", 1.0))
                out.append(_target(f"{key}: resume requests (construct + first batch) / cold's",
                                   _div(resumed["requests"]["requests"], r["requests"]["requests"]), "<=", 1.0))
                out.append(_target(f"{key}: the resumed batch is the one the cold run yielded next (1 = yes)",
                                   float(bool(resumed.get("exact"))), ">=", 1.0))
    for name, value in ratio.items():
        if name.endswith(("/ litdata", "/ streaming")) and " 50ms / " in name:
            out.append(_target(f"{name} (samples/s, ahead)", value, ">=", 1.0))
    return out


# -- printing -------------------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def one_line(r: dict[str, Any]) -> str:
    if not r.get("ok"):
        return f"FAILED: {r.get('error')} {(r.get('stderr') or '')[-400:]!r}"
    req = r["requests"]
    first = r.get("first_batch_s", r.get("first_row_s"))
    return (f"{_f(rate(r))}/s, first {_f(first, 2)} s, construct {_f(r.get('construct_s'), 2)} s "
            f"({_f(construct_requests(r))} requests), "
            f"PSS {_f((r.get('peak_pss_bytes') or 0) / 2**20)} MB, {req['requests']} requests "
            f"(GET {req['GET']}, HEAD {req['HEAD']}, LIST {req['LIST']}), {r['bytes_read'] / 1e6:.1f} MB, "
            f"others {_f(r.get('others_cores'), 2)} cores")


def _grid(results: list[dict[str, Any]], project: str, contender: str, latencies: list[float | None]) -> list[str]:
    rows = []
    for dataset, fmt in dict.fromkeys((r["dataset"], r["format"]) for r in results
                                      if r["project"] == project and r["contender"] == contender):
        cells = []
        local = _find(results, project=project, contender=contender, dataset=dataset, format=fmt, latency_ms=None)
        for latency in latencies:
            r = _find(results, project=project, contender=contender, dataset=dataset, format=fmt, latency_ms=latency)
            if r is None:
                cells.append(f"{'':>17s}")
                continue
            x = _div(rate(r), rate(local)) if latency is not None and local else None
            cells.append(f"{_f(rate(r)):>9s} {('(' + _f(x, 2) + 'x)') if x is not None else '':>7s}")
        rows.append(f"  {dataset:9s} {fmt:8s} " + " ".join(cells))
    return rows


def _cap(mb_per_s: float) -> str:
    return f"{mb_per_s:g} MB/s per connection" if mb_per_s else "none"


def tables(out: dict[str, Any]) -> str:
    results = out["results"]
    machine = out["machine"]
    s = out["settings"]
    lines = [f"bench_remote: {machine.get('cores')} cores ({machine.get('cpu')}), load average at the end "
             f"{machine.get('loadavg_end')}; bandwidth cap {_cap(s['bandwidth'])}; "
             f"{out['seconds']:.0f} s",
             "projects: " + ", ".join(f"{n} = {p['path']} ({p['commit']})" for n, p in out["projects"].items())]
    latencies = [None, *sorted({r["latency_ms"] for r in results if r["latency_ms"] is not None})]
    head = f"  {'dataset':9s} {'format':8s} " + " ".join(f"{_ms(x):>17s}" for x in latencies)
    for project in out["projects"]:
        for contender in ("reader", *LOADERS):
            grid = _grid(results, project, contender, latencies)
            if grid:
                unit = "rows/s" if contender == "reader" else "samples/s after the first batch"
                lines += ["", f"{project}: {contender} ({unit}; x = / local)", head, *grid]
    lines += ["", "every run (c. req: requests while constructing; req, GET, HEAD, LIST, MB read: the whole run; "
              "others: cores used by other processes meanwhile):",
              f"  {'run':58s} {'rate/s':>9s} {'x local':>7s} {'first s':>7s} {'constr s':>8s} {'c. req':>6s} "
              f"{'PSS MB':>7s} {'req':>6s} {'GET':>6s} {'HEAD':>5s} {'LIST':>5s} {'MB read':>8s} {'others':>6s}"]
    for r in results:
        if not r.get("ok"):
            lines.append(f"  {r['name']:58s} FAILED: {r.get('error')}")
            continue
        x = out["ratios"].get(f"{_key(r)} / local") if r["project"] else None
        req = r["requests"]
        first = r.get("first_batch_s", r.get("first_row_s"))
        lines.append(f"  {r['name']:58s} {_f(rate(r)):>9s} {_f(x, 2):>7s} {_f(first, 2):>7s} "
                     f"{_f(r.get('construct_s'), 2):>8s} {_f(construct_requests(r)):>6s} "
                     f"{_f((r.get('peak_pss_bytes') or 0) / 2**20):>7s} "
                     f"{req['requests']:6d} {req['GET']:6d} {req['HEAD']:5d} {req['LIST']:5d} "
                     f"{r['bytes_read'] / 1e6:8.1f} {_f(r.get('others_cores'), 2):>6s}")
    peers = {k: v for k, v in out["ratios"].items() if k.endswith(("/ litdata", "/ streaming", "/ s3fs"))}
    if peers:
        lines += ["", "audioloader / peer (samples/s, same features, dataset, latency):"]
        lines += [f"  {k:70s} {_f(v, 2)}" for k, v in peers.items()]
    if out["targets"]:
        lines += ["", "issue 19 targets:"]
        for t in out["targets"]:
            mark = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
            lines.append(f"  {t['target']:78s} {_f(t['value'], 2):>8s} {t['comparison']} {t['threshold']:<7g} {mark}")
    return "\n".join(lines)
