"""What a night's Ray Data stream costs Ray's long-lived processes, per block it streams.

A night runs one block per document through an actor pool and reads the outcomes as they finish
(`pipelines.job._summarize`). This streams `--blocks` one-row blocks the same way through a
do-nothing actor, on a Ray started here with the run's settings (`pipelines.ray_session`), and
prints the resident memory of Ray Data's stats actor and of the GCS every 500 blocks. Two
switches compare the night's choices with the alternatives:

    python -m bench.stream_memory --read batches    # iter_batches, as the night read until 0afb739
    python -m bench.stream_memory --read blocks     # by block reference, as it reads now
    python -m bench.stream_memory --task-records 10000   # the GCS's task-record cap

A measurement, not a test: figures in docs/results.md ("Soak").
"""

from __future__ import annotations

import argparse
import os
import time

REPORT_EVERY = 500


def rss_mib(fragment: str) -> list[int]:
    """Resident MiB of each process below this one whose command line holds `fragment` (the
    Ray started here; other Rays on the host are not ours)."""
    from bench import processes

    return [
        (processes.rss_kib(pid) or 0) // 1024
        for pid in sorted(processes.descendants(os.getpid()))
        if fragment in processes.command(pid)
    ]


class Passthrough:
    def __call__(self, batch):
        return batch


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.stream_memory", description=__doc__)
    p.add_argument("--blocks", type=int, default=3000, help="One-row blocks to stream.")
    p.add_argument("--read", choices=("blocks", "batches"), default="blocks")
    p.add_argument("--task-records", type=int, default=None, help="GCS task-record cap.")
    args = p.parse_args(argv)

    import pyarrow as pa
    import ray

    from pipelines.job import finished_blocks
    from pipelines.ray_session import init_kwargs

    kwargs = init_kwargs(None)
    if args.task_records is not None:
        kwargs["_system_config"] = {"task_events_max_num_task_in_gcs": args.task_records}
    ray.init(**kwargs)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = (
            ray.data.from_arrow(pa.table({"i": list(range(args.blocks))}))
            .repartition(args.blocks)
            .map_batches(Passthrough, batch_size=1, batch_format="pyarrow", num_cpus=0.25,
                         compute=ray.data.ActorPoolStrategy(size=1))
        )  # fmt: skip
        if args.read == "blocks":
            blocks = finished_blocks(ray, ds)
        else:
            blocks = ds.iter_batches(batch_size=None, batch_format="pyarrow")
        t0 = time.time()
        for n, _ in enumerate(blocks, start=1):
            if n % REPORT_EVERY == 0:
                print(f"{n:6d} blocks {time.time() - t0:7.1f} s  stats actor MiB "
                      f"{rss_mib('_StatsActor')}  GCS MiB {rss_mib('gcs_server')}", flush=True)  # fmt: skip
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
