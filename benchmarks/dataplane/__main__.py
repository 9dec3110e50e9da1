"""`python -m benchmarks.dataplane [--size 256M] [--nodes 1,2,4] [--pairs 3] [--origin-rate 8MiB]`.

Starts the benchmark's own real-node test bed (`bed`), runs the pairs (`run.sequence`), prints
each run's line and then the table (`figures.table`), and always stops the bed. Exit 0 when
every run finished, 1 when a run failed (what was measured before it is still printed), 2
when this machine cannot host the bed or an argument is wrong.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from benchmarks.dataplane import bed as bed_mod
from benchmarks.dataplane import figures, run
from localcache.devenv import realnodes

BUCKET = "bench-models"
LINK_FACTOR = 5  # each node's link is five times the origin's total egress


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dataplane")
    parser.add_argument("--size", type=figures.parse_size, default="256M",
                        help="the model's size in all (256M, 1G, 512Mi): default 256M")  # fmt: skip
    parser.add_argument("--files", type=int, default=8, help="files in the model: default 8")
    parser.add_argument("--nodes", type=figures.parse_nodes, default="1,2,4",
                        help="node counts, comma-separated: default 1,2,4")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=3,
                        help="(baseline, peer) pairs per node count: default 3")  # fmt: skip
    parser.add_argument("--origin-rate", type=figures.parse_size, default="8MiB",
                        help="the origin's total egress per second: default 8MiB; "
                        f"each node's link is {LINK_FACTOR}x that")  # fmt: skip
    args = parser.parse_args(argv)
    if args.pairs < 1 or not 1 <= args.files <= 64:
        parser.error("--pairs must be at least 1 and --files between 1 and 64")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    reason = realnodes.unavailable_reason()
    if reason is not None:
        print(f"bench-dataplane: this machine cannot host the real-node test bed: {reason}")
        return 2
    shape = bed_mod.Shape(origin_rate=args.origin_rate, link_rate=LINK_FACTOR * args.origin_rate)
    size: int = args.size
    print(
        f"data plane: model {size / 1e6:.0f} MB in {args.files} files (s3://, KServe's storage "
        f"initializer); origin capped at {shape.origin_rate / 2**20:.1f} MiB/s in total, each "
        f"node's link at {shape.link_rate / 2**20:.1f} MiB/s each way; nodes "
        f"{','.join(map(str, args.nodes))}; {args.pairs} pair(s) (baseline, peer) each; "
        f"S/O = {size / shape.origin_rate:.1f} s",
        flush=True,
    )
    started = time.monotonic()
    bench = bed_mod.BenchBed(nodes=max(args.nodes), shape=shape)
    runs: list[figures.Run] = []
    code = 0
    try:
        bench.start()
        print(
            f"bed of {bench.nodes} node(s) ready in {time.monotonic() - started:.0f}s", flush=True
        )
        bench.tenant(run.NAMESPACE)
        model = run.Model(
            uri=bench.upload_model(BUCKET, "model", files=args.files, size=size),
            files=args.files,
            size=size,
        )
        runs = run.sequence(
            bench,
            model=model,
            node_counts=args.nodes,
            pairs=args.pairs,
            say=lambda line: print(line, flush=True),
        )
    except Exception as exc:  # report what was measured, then fail
        print(f"bench-dataplane: a run failed: {type(exc).__name__}: {exc}", flush=True)
        print(bench.diagnose(), flush=True)
        code = 1
    finally:
        bench.stop()
    if runs:
        print()
        print(figures.table(figures.summarize(runs, size=size)))
    print(f"bench-dataplane finished in {time.monotonic() - started:.0f}s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
