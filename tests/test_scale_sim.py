"""The scale simulator (benchmarks/scale/bench_scale.py) checked against a real run: 2 "machines" x 2 ranks, each
rank its own process with its machine's cache, reading an evaluation pass of 500 small files from moto behind a proxy
per machine. The requests the simulator predicts (the same code against its counting store) are the requests the
proxies saw, kind by kind, and every row is read exactly once. The full-size run (8 x 4 ranks, 20,000 files) is
``benchmarks/scale/bench_scale_real.py``; docs/benchmarks.md has its figures.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("index", ["manifest", "none"])
def test_the_simulator_predicts_the_requests_a_real_run_makes(index):
    from benchmarks.scale import bench_scale_real

    args = bench_scale_real.parse_args(["--files", "500", "--machines", "2", "--ranks-per-machine", "2",
                                        "--index", index, "--latency-ms", "0"])
    out = bench_scale_real.main(args)
    assert out["seen"] == out["predicted"], out["machines"]
    for machine in out["machines"]:
        assert machine["seen"] == machine["predicted"], machine
        # each machine's 2 ranks read half the files; without a manifest its leader scans every file first
        assert machine["objects_fetched"] == (250 if index == "manifest" else 500)
    assert out["rows_exactly_once"]
    if index == "manifest":
        assert out["seen"]["LIST"] == 0 and all(m["seen"]["HEAD"] <= 1 + 2 * 250 for m in out["machines"])
    else:  # the machine's leader lists once: 1 LIST call (one page of the folder, no folder check first) a machine
        assert all(m["seen"]["LIST"] == 1 for m in out["machines"])
