"""Loop the two-node test's launches and count how each torchrun process exited (issue 39, item 5: about one run in
6-14 of tests/test_multinode.py had a rank abort at interpreter exit, "terminate called without an active exception").

Usage: ulimit -c unlimited; python tests/multinode_loop.py RUNS OUT [RANKS_PER_NODE]

One moto server and one proxy a node for all runs (cheaper than the test, which starts them per run); each run is
the test's three launches (``train`` and ``resume`` on 2 nodes, ``finish`` on 1), each process in its own folder
under OUT (a core dump lands there: ``gdb -batch -ex "thread apply all bt" python CORE``). A launch that exits 0
without the abort message is deleted; the others are kept. Prints one line a launch, then the counts as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import make_shards  # noqa: E402
from tests.s3_server import S3_ENVIRONMENT, FaultProxy, S3Server  # noqa: E402
from tests.test_multinode import EXIT_ABORT, FILES, PREFIX, ROWS, free_port  # noqa: E402

ACTIONS = (("train", 2), ("resume", 2), ("finish", 1))  # (action, nodes), as the test runs them


def launch(action: str, urls: list[str], ranks: int, out: Path, run: Path) -> list[tuple[int, bool]]:
    """``action`` on ``len(urls)`` torchrun invocations at once; ``[(exit code, aborted at exit)]`` a node."""
    port, processes = free_port(), []
    for k, url in enumerate(urls):
        node = run / f"node-{k}"
        node.mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SHARDS_URL": url, "AUDIOLOADER_CACHE": str(out / f"cache-{k}"),
               "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(urls)}",
                   f"--nproc-per-node={ranks}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   f"--rdzv-id={action}-{port}", "--local-addr=127.0.0.1", "--max-restarts=0",
                   str(ROOT / "tests" / "multinode_worker.py"), action, str(out)]
        with open(node / "output.txt", "w") as log:
            processes.append(subprocess.Popen(command, cwd=node, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=600) for p in processes]
    return [(code, EXIT_ABORT in (run / f"node-{k}" / "output.txt").read_text()) for k, code in enumerate(codes)]


def main() -> None:
    runs, out = int(sys.argv[1]), Path(sys.argv[2])
    ranks = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(S3_ENVIRONMENT)
    server = S3Server()
    host, port = server.direct_endpoint.split(":")
    proxies = [FaultProxy((host, int(port))) for _ in range(2)]
    counts = {"runs": 0, "launches": 0, "nonzero_launches": 0, "aborted_at_exit": 0, "failed_runs": 0}
    try:
        make_shards(out / "shards", [ROWS] * FILES, "ipc_file", batch_rows=4, seconds=0.5)
        server.upload(out / "shards", PREFIX)
        urls = [f"s3://{PREFIX}?endpoint_override={p.endpoint}&scheme=http&region=us-east-1" for p in proxies]
        for i in range(runs):
            failed = False
            for action, nodes in ACTIONS:
                run = out / f"run-{i:03d}-{action}"
                result = launch(action, urls[:nodes], ranks, out, run)
                bad = any(code for code, _ in result) or any(aborted for _, aborted in result)
                counts["launches"] += 1
                counts["nonzero_launches"] += any(code for code, _ in result)
                counts["aborted_at_exit"] += sum(aborted for _, aborted in result)
                failed |= bad
                print(i, action, result, flush=True)
                if not bad:
                    shutil.rmtree(run)
            counts["runs"] += 1
            counts["failed_runs"] += failed
    finally:
        for proxy in proxies:
            proxy.close()
        server.close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
