"""`make demo`: tonight's job on the embedded defaults, start to finish, in a few minutes.

Starts a cpu-long replica, plays production-shaped chat against it, runs the nightly flow with the
SLO controller on a handful of ~80k-token documents, each summarized whole, and prints what a
platform team would look at in the morning: chat latency against the SLO in each window, each
document, the replica's preemptions, batch tokens/s, cost, where the DuckDB file and the HTML
report are. `--short` (`make demo-short`) runs sixteen short documents in map-reduce sections on
cpu-small instead (flows/demo_variants.py). Everything it starts it stops, on Ctrl-C too, and it
stops when the process that started it dies: `kill -9` of `make demo` would otherwise leave the
demo running on, its parent gone, until its night ended.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from flows.demo_report import print_morning_report
from flows.demo_variants import Demo, DemoRefused, host_config, parse_demo

CHAT_RATE, CHAT_SCALE, BASELINE_S = 1.0, 0.1, 20.0


def main(argv: Sequence[str] | None = None) -> int:
    from serving.replica_guard import die_with_parent, starter_pid

    die_with_parent(starter_pid())  # SIGTERM, as from a supervisor, when its starter dies
    demo, results = parse_demo(sys.argv[1:] if argv is None else argv)
    try:
        config_path, fit_path = config_for_this_host(demo)
    except DemoRefused as exc:
        print(f"{demo.name}: {exc}", file=sys.stderr)
        return 2
    from bench.chat_load import ChatLoadSpec
    from bench.chat_sessions import ChatShape
    from bench.chat_thread import ChatLoadThread
    from bench.slo_baseline import measure_slo
    from flows.nightly import default_pipeline, nightly_summarization
    from flows.prefect_server import tie_temporary_server
    from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus
    from pipelines.ray_session import stop_on_sigterm
    from scheduler.latency_model import LatencyModel
    from serving.engine_config import load_engine_config
    from serving.launcher import ReplicaSet, free_port
    from serving.tokenizer import tokenizer_for

    stop_on_sigterm()  # SIGTERM ends the demo as Ctrl-C does
    tie_temporary_server()  # Prefect's server goes with the demo, however the demo ends
    config = load_engine_config(config_path)
    tokenizer = tokenizer_for(config)
    run_id = time.strftime(f"{demo.name}-%Y%m%d-%H%M%S")
    docs, low, high = demo.docs, demo.min_tokens, demo.max_tokens
    spec = CorpusSpec(docs=docs, min_tokens=low, max_tokens=high, seed=0)
    corpus = write_corpus(make_corpus(spec, tokenizer), results / demo.name / "corpus.parquet")
    print(f"corpus: {docs} documents of {low}-{high} tokens at {corpus}")
    port = free_port()
    print(f"starting {config.name} on port {port} (about a minute) ...", flush=True)
    shape = ChatShape().scaled(CHAT_SCALE)
    preempted = None
    with ReplicaSet(results / "engines").running(config, str(config_path), port) as started:
        replicas = [(r.name, r.base_url) for r in started]
        urls = [url for _, url in replicas]
        # This machine's SLO: 3x what chat alone gets here, measured now (bench/slo_baseline.py).
        print(f"chat alone for {BASELINE_S:.0f} s, to set this machine's SLO ...", flush=True)
        alone = ChatLoadSpec(shape=shape, rate=CHAT_RATE, duration_s=BASELINE_S, seed=1)
        fit = LatencyModel.from_json(fit_path)
        measured = measure_slo(replicas, config, tokenizer, alone, f"{run_id}-alone", fit)
        slo = print_slo(measured)
        before = preemptions(urls) if demo.itemized else None
        chat = ChatLoadThread(
            replicas,
            config.model.served_name,
            tokenizer,
            ChatLoadSpec(shape=shape, rate=CHAT_RATE, duration_s=3600),
            run_id,
            gate_run_id=run_id,
        ).start()
        try:
            out = nightly_summarization(
                corpus=str(corpus),
                engine_config=str(config_path),
                replica_urls=urls,
                run_id=run_id,
                results=str(results),
                policy="slo",
                latency_model=str(fit_path),
                slo=slo,
                pipeline=default_pipeline(config).model_copy(update=demo.pipeline),
                stop_after_s=demo.summarize_s,
            )
        finally:
            chat_result = chat.stop()
        if before is not None:
            preempted = (before, preemptions(urls))
    add_chat_and_reload(results, run_id, chat_result)
    print_morning_report(results, run_id, out, slo, demo, preempted)
    return 0


def print_slo(measured):
    """Say which SLO tonight runs under, and why when it is the two-step floor; return it."""
    slo = measured.slo
    if measured.floored:
        print(
            f"3x chat alone is an ITL p99 of {3 * measured.chat_alone['itl_ms']['p99']:.0f} "
            "ms, under two full engine steps; the SLO takes those instead",
            flush=True,
        )
    print(
        f"SLO: chat ITL p99 <= {slo.chat_itl_p99_ms:.0f} ms, TTFT p99 <= "
        f"{slo.chat_ttft_p99_ms:.0f} ms",
        flush=True,
    )
    return slo


def config_for_this_host(demo: Demo) -> tuple[Path, Path]:
    """`demo`'s engine config and latency fit on this CPU (flows.demo_variants.host_config)."""
    from serving.cpu_features import cpu_flags, lacks_native_bf16

    no_bf16 = lacks_native_bf16(cpu_flags())
    config, fit = host_config(demo, no_bf16)
    if no_bf16:
        print(f"this CPU has no native bf16: running {config.stem} (float32)", flush=True)
    return config, fit


def preemptions(urls: list[str]) -> float:
    """vLLM's `vllm:num_preemptions_total`, summed over the replicas, from their /metrics."""
    import httpx

    from serving.metrics import parse_metrics

    return sum(
        parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text).counter("vllm:num_preemptions")
        for url in urls
    )


def add_chat_and_reload(results: Path, run_id: str, chat) -> None:
    """The chat records join the run's own, then the run is loaded and reported again."""
    from flows.report import write_report
    from warehouse.load import load_results
    from warehouse.run_files import run_dir, write_table

    directory = run_dir(results, run_id)
    write_table(directory, "requests", [r.row() for r in chat.records], run_id=run_id, part="chat")
    write_table(
        directory,
        "token_gaps",
        [{"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t} for g in chat.gaps],
        run_id=run_id,
        part="chat",
    )
    load_results(results, [run_id])
    write_report(results, run_id)


if __name__ == "__main__":
    from pipelines.errors import Terminated

    try:
        sys.exit(main())
    except Terminated:
        print("\nstopped by SIGTERM; replicas stopped", file=sys.stderr)
        sys.exit(143)
    except KeyboardInterrupt:
        print("\ninterrupted; replicas stopped", file=sys.stderr)
        sys.exit(130)
