"""Chat latency in the vocabulary of vLLM's serving benchmark: TTFT, TPOT, ITL, E2E and goodput.

Pure: records in, figures out. Each latency is given as mean, median, p90, p95, p99 and p99.9 in
milliseconds (`p50` is kept beside `median` for the reports that read it). TTFT, TPOT and E2E are
per request over requests that ended ok; ITL is over every token gap (token-weighted), as in
docs/design.md §4.6. TPOT is a request's decode time per output token after the first,
`(e2e - ttft) / (output_tokens - 1)`, vLLM's definition, so requests of one token have none.

`goodput` is vLLM's `--goodput`: requests per second that met every per-request SLO given
(`ttft`, `tpot`, `e2el` in ms). It judges requests one by one, which is not what the SLO windows
judge (a window's p99s); the batch figure beside it, `slo_batch_tokens_per_s`, is batch tokens
per second in windows that held the SLO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean

from scheduler.records import RequestRecord, percentile
from scheduler.slo import SLO

PERCENTILES = (("median", 50.0), ("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0),
               ("p99.9", 99.9))  # fmt: skip
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
"""Per-request SLO names of vLLM's `--goodput KEY:MS ...`."""


def latency_stats_ms(values_s: Iterable[float]) -> dict[str, float | None]:
    """Mean and percentiles, in ms, of latencies given in seconds; None where there are none."""
    ordered = sorted(values_s)
    if not ordered:
        return {"mean": None, **{name: None for name, _ in PERCENTILES}}
    stats = {name: 1000.0 * percentile(ordered, q) for name, q in PERCENTILES}
    return {"mean": 1000.0 * fmean(ordered), **stats}


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token after the first; None for requests without a decode phase."""
    if r.ttft_s is None or r.e2e_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def request_latency(chat: list[RequestRecord]) -> dict[str, dict[str, float | None]]:
    """TTFT, TPOT, ITL and E2E statistics of `chat` (ITL from the streamed gaps)."""
    ok = [r for r in chat if r.status == "ok"]
    return {
        "ttft_ms": latency_stats_ms(r.ttft_s for r in ok if r.ttft_s is not None),
        "tpot_ms": latency_stats_ms(t for r in ok if (t := tpot_s(r)) is not None),
        "itl_ms": latency_stats_ms(g.gap_s for r in chat for g in r.gaps),
        "e2e_ms": latency_stats_ms(r.e2e_s for r in ok if r.e2e_s is not None),
    }


def goodput_slos(slo: SLO) -> dict[str, float]:
    """Per-request SLOs that match the window SLO's targets: TTFT, TPOT against the ITL target
    (a request's mean gap), and E2E when the SLO sets one."""
    slos = {"ttft": slo.chat_ttft_p99_ms, "tpot": slo.chat_itl_p99_ms}
    return slos | ({"e2el": slo.chat_e2e_p99_ms} if slo.chat_e2e_p99_ms is not None else {})


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` (vLLM's `--goodput` syntax) → {"ttft": 500.0, "tpot": 50.0}."""
    slos: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in GOODPUT_KEYS or not ms > 0:
            raise ValueError(
                f"--goodput {item!r}: write KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)} and "
                "a positive number of ms, e.g. ttft:500 tpot:50"
            )
        slos[key] = ms
    return slos


def meets(r: RequestRecord, slos: Mapping[str, float]) -> bool:
    """Did request `r` end ok within every per-request SLO of `slos` (ms)?"""
    if r.status != "ok":
        return False
    got = {"ttft": r.ttft_s, "tpot": tpot_s(r), "e2el": r.e2e_s}
    for key, limit_ms in slos.items():
        value = got[key]
        if key == "tpot" and value is None:
            continue  # a one-token answer has no decode to judge
        if value is None or 1000.0 * value > limit_ms:
            return False
    return True


def goodput(chat: list[RequestRecord], slos: Mapping[str, float], seconds: float) -> dict:
    """Requests per second over `seconds` that met `slos`, with the SLOs and the share that met."""
    good = sum(meets(r, slos) for r in chat)
    return {
        "goodput": good / seconds if seconds > 0 else 0.0,
        "goodput_slos_ms": dict(slos),
        "goodput_share": good / len(chat) if chat else None,
    }
