"""`make demo`: tonight's job on the embedded defaults, start to finish, in a few minutes.

Starts a cpu-small replica, plays production-shaped chat against it, runs the nightly flow with the
SLO controller on a sample corpus, and prints what a platform team would look at in the morning:
chat latency against the SLO, batch documents and tokens/s, cost, where the DuckDB file and the
HTML report are. Everything it starts it stops, on Ctrl-C too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

CONFIG = Path("engine_configs/cpu-small.yaml")
FIT = Path("engine_configs/fits/cpu-small.json")
# On a CPU without native bf16, cpu-small's bf16 runs several times slower than float32 there
# (serving/cpu_features.py): the demo takes its float32 twin, fitted on such a host.
CONFIG_FP32 = Path("engine_configs/cpu-small-fp32.yaml")
FIT_FP32 = Path("engine_configs/fits/cpu-small-fp32.json")
RESULTS = Path("results")
DOCS, MIN_TOKENS, MAX_TOKENS = 16, 1500, 8000
CHAT_RATE, CHAT_SCALE, BASELINE_S = 1.0, 0.1, 20.0
SECTION_TOKENS = 1024
"""The demo summarizes in map-reduce sections: cpu-small's attention cost grows with a chunk's
prefix ~25x faster than a 70B replica's, so at the demo's tight SLO a chunk a few thousand tokens
into a whole document gets almost no step time and the demo would outlast its minutes. Whole
documents at the mission's scale run on the long-context stand-in, cpu-long."""
SUMMARIZE_S = 300.0
"""The night's deadline: documents not done by then are reported as stopped, not waited for."""


def main() -> int:
    from bench.chat_load import ChatLoadSpec
    from bench.chat_sessions import ChatShape
    from bench.chat_thread import ChatLoadThread
    from bench.slo_baseline import measure_slo
    from flows.nightly import default_pipeline, nightly_summarization
    from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus
    from scheduler.latency_model import LatencyModel
    from serving.engine_config import load_engine_config
    from serving.launcher import ReplicaSet, free_port
    from serving.tokenizer import tokenizer_for

    config_path, fit_path = host_config()
    config = load_engine_config(config_path)
    tokenizer = tokenizer_for(config)
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    spec = CorpusSpec(docs=DOCS, min_tokens=MIN_TOKENS, max_tokens=MAX_TOKENS, seed=0)
    corpus = write_corpus(make_corpus(spec, tokenizer), RESULTS / "demo" / "corpus.parquet")
    print(f"corpus: {DOCS} documents of {MIN_TOKENS}-{MAX_TOKENS} tokens at {corpus}")
    port = free_port()
    print(f"starting {config.name} on port {port} (about a minute) ...", flush=True)
    shape = ChatShape().scaled(CHAT_SCALE)
    with ReplicaSet(RESULTS / "engines").running(config, str(config_path), port) as started:
        replicas = [(r.name, r.base_url) for r in started]
        # This machine's SLO: 3x what chat alone gets here, measured now (bench/slo_baseline.py).
        print(f"chat alone for {BASELINE_S:.0f} s, to set this machine's SLO ...", flush=True)
        alone = ChatLoadSpec(shape=shape, rate=CHAT_RATE, duration_s=BASELINE_S, seed=1)
        fit = LatencyModel.from_json(fit_path)
        measured = measure_slo(replicas, config, tokenizer, alone, f"{run_id}-alone", fit)
        slo = print_slo(measured)
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
                replica_urls=[url for _, url in replicas],
                run_id=run_id,
                results=str(RESULTS),
                policy="slo",
                latency_model=str(fit_path),
                slo=slo,
                pipeline=default_pipeline(config).model_copy(
                    update={"mode": "map_reduce", "section_tokens": SECTION_TOKENS}
                ),
                stop_after_s=SUMMARIZE_S,
            )
        finally:
            chat_result = chat.stop()
    add_chat_and_reload(run_id, chat_result)
    print_morning_report(run_id, out, slo)
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


def host_config() -> tuple[Path, Path]:
    """The engine config and latency fit for this host: cpu-small, or its float32 twin."""
    from serving.cpu_features import cpu_flags, lacks_native_bf16

    if lacks_native_bf16(cpu_flags()):
        print(f"this CPU has no native bf16: running {CONFIG_FP32.stem} (float32)", flush=True)
        return CONFIG_FP32, FIT_FP32
    return CONFIG, FIT


def add_chat_and_reload(run_id: str, chat) -> None:
    """The chat records join the run's own, then the run is loaded and reported again."""
    from flows.report import write_report
    from warehouse.load import load_results
    from warehouse.run_files import run_dir, write_table

    directory = run_dir(RESULTS, run_id)
    write_table(directory, "requests", [r.row() for r in chat.records], run_id=run_id, part="chat")
    write_table(
        directory,
        "token_gaps",
        [{"request_id": g.request_id, "idx": g.idx, "gap_s": g.gap_s, "t": g.t} for g in chat.gaps],
        run_id=run_id,
        part="chat",
    )
    load_results(RESULTS, [run_id])
    write_report(RESULTS, run_id)


def print_morning_report(run_id: str, out: dict, slo) -> None:
    """Chat latency against the SLO, batch progress and cost, from the warehouse."""
    from rich.console import Console
    from rich.table import Table

    from warehouse.run_figures import run_figures

    figures = run_figures(RESULTS, run_id)
    db, latency, goodput, cost = figures.db, figures.latency, figures.goodput, figures.cost
    console = Console(width=150)
    table = Table(title=f"run {run_id}: latency (ms)")
    for col in (
        "class",
        "requests",
        "TTFT p50",
        "p95",
        "p99",
        "ITL p50",
        "p95",
        "p99",
        "E2E p50",
        "p95",
        "p99",
    ):
        table.add_column(col, justify="right")
    for row in latency:
        table.add_row(
            row["class"],
            str(row["requests"]),
            *(_ms(row[f"{m}_p{q}_ms"]) for m in ("ttft", "itl", "e2e") for q in (50, 95, 99)),
        )
    console.print(table)
    console.print(
        f"SLO: chat ITL p99 ≤ {slo.chat_itl_p99_ms:.0f} ms, TTFT p99 ≤ "
        f"{slo.chat_ttft_p99_ms:.0f} ms per {slo.window_s:.0f} s window: held in "
        f"{goodput['windows_met']} of {goodput['windows']} windows (ITL judged by the replica's "
        "own histogram, as the Gate reads it; the table's ITL is what the chat client saw)"
    )
    job = out["job"]
    console.print(
        f"batch: {job['docs_done']} documents done, {job['docs_failed']} failed; "
        f"{goodput['batch_tokens_per_s']:,.0f} tokens/s, "
        f"{goodput['slo_batch_tokens_per_s']:,.0f} tokens/s in windows that held the SLO, "
        f"{goodput['documents_per_hour']:,.0f} documents/hour"
    )
    console.print(
        f"cost: ${cost['cost_usd']:.4f} for the run, "
        f"${cost['usd_per_1m_batch_tokens']:.3f} per 1M batch tokens, "
        f"${cost['usd_per_document']:.5f} per document"
    )
    console.print(
        f"\nDuckDB: {db}\n"
        f'  .venv/bin/nightshift sql "SELECT class, ttft_p99_ms, itl_p99_ms FROM class_latency '
        f"WHERE run_id = '{run_id}'\"\n"
        f'  .venv/bin/nightshift sql "SELECT window_idx, class, itl_p99_ms, slo_met FROM '
        f"slo_windows WHERE run_id = '{run_id}' ORDER BY window_idx\""
    )
    console.print(f"report: {out['report']['html']}")


def _ms(value) -> str:
    """A latency cell: NULL (a class without such figures, e.g. batch ITL) reads as a dash."""
    return "–" if value is None or value != value else f"{value:.1f}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted; replicas stopped", file=sys.stderr)
        sys.exit(130)
