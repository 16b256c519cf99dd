"""The benchmark's side-by-side report: a table of every scenario and plots over time."""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = (
    ("chat ITL p99 ms", ("chat", "itl_ms", "p99")),
    ("client ITL p99 ms", ("chat", "client_itl_ms", "p99")),
    ("chat TTFT p99 ms", ("chat", "ttft_ms", "p99")),
    ("chat E2E p99 ms", ("chat", "e2e_ms", "p99")),
    ("SLO windows met", ("chat", "slo_windows_met")),
    ("chat errors", ("chat", "errors")),
    ("batch tok/s", ("batch", "tokens_per_s")),
    ("goodput tok/s", ("batch", "slo_batch_tokens_per_s")),
    ("docs done", ("batch", "docs_done")),
)


ITL_NOTE = (
    "Chat ITL is judged on the engine's side: the engine plug-in's chat-only gaps where the "
    "replica runs it, else vLLM's ITL histogram (every decoding sequence, stamped in the engine "
    "core); the client's streamed gaps, which also carry the host's scheduling noise, are shown "
    "as client ITL."
)
SIM_ITL_NOTE = "Simulated replicas: chat ITL is the gaps between the simulated engine's steps."


def itl_note(out: dict) -> str:
    return SIM_ITL_NOTE if out.get("mode") == "sim" else ITL_NOTE


def corpus_warning(out: dict) -> str | None:
    """What to say when some scenario ran out of documents, or None."""
    bound = out.get("summary", {}).get("corpus_bound") or []
    if not bound:
        return None
    return (
        f"{', '.join(bound)} finished every document of the corpus before the scenario ended: "
        "its batch tok/s measures the corpus, not the policy, and ratios with it are no verdict. "
        "Run again with more --docs."
    )


def fit_note(out: dict) -> str | None:
    """How far the plug-in found this replica's steps from the latency fit, where it measured them:
    in the step probe, which prices the SLO's ITL floor, and in the controlled run, which prices
    the bound beside the one priced with the fit as it is (`bound_tokens_per_s`)."""
    s, basis = out.get("summary", {}), out.get("slo_basis", {})
    ratio, bound = s.get("step_time_ratio"), s.get("bound_tokens_per_s_measured")
    probe = basis.get("floor_step_ratio")
    said = []
    if probe:
        said.append(
            f"The step probe measured batch steps at {probe:.2f}x the latency fit's prediction "
            f"(median): the SLO's ITL floor is {basis['itl_floor_ms']:g} ms at that ratio "
            f"({basis['itl_floor_ms_fit']:g} ms by the fit as it is)."
        )
    if ratio and bound:
        said.append(
            f"The plug-in measured the controlled run's batch steps at {ratio:.2f}x the fit's "
            f"prediction: the bound priced as measured is {bound:,.0f} tok/s; "
            "`bound_tokens_per_s` uses the fit as it is."
        )
    if not said:
        return None
    return " ".join(
        [*said, "For a fit of this host: `nightshift calibrate --engine-config CONFIG --out FIT`, "
         "then `--latency-model FIT`."]
    )  # fmt: skip


def _get(d: dict, path: tuple[str, ...]):
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}" if v < 10 else f"{v:,.0f}"
    return str(v)


def table_rows(out: dict) -> list[list[str]]:
    rows = []
    for name, s in out["scenarios"].items():
        label = f"{name} ({s['caps']})" if "caps" in s else name
        rows.append([label] + [_fmt(_get(s, path)) for _, path in COLUMNS])
    return rows


def markdown(out: dict, command: str) -> str:
    slo = out["slo"]
    head = ["scenario"] + [c for c, _ in COLUMNS]
    lines = [
        f"# nightshift bench `{out.get('bench_id', '')}`",
        "",
        f"SLO: chat ITL p99 ≤ {slo['chat_itl_p99_ms']} ms, TTFT p99 ≤ "
        f"{slo['chat_ttft_p99_ms']} ms, per {slo['window_s']:.0f} s window.",
        "",
        itl_note(out),
        "",
        f"Command: `{command}`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(out)]
    if warning := corpus_warning(out):
        lines += ["", f"**{warning}**"]
    if note := fit_note(out):
        lines += ["", note]
    lines += ["", "Summary:", "", "```", json.dumps(out["summary"], indent=2), "```", ""]
    return "\n".join(lines)


def plot(out: dict, path: Path) -> Path:
    names = list(out["scenarios"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    itl = [_get(out["scenarios"][n], ("chat", "itl_ms", "p99")) or 0 for n in names]
    a.bar(
        names,
        itl,
        color=["#4c72b0" if v <= out["slo"]["chat_itl_p99_ms"] else "#c44e52" for v in itl],
    )
    a.axhline(out["slo"]["chat_itl_p99_ms"], color="black", linestyle="--", label="SLO")
    a.set_yscale("log")
    a.set_title("Chat ITL p99 (ms)")
    a.legend()
    b.bar(
        names,
        [_get(out["scenarios"][n], ("batch", "slo_batch_tokens_per_s")) or 0 for n in names],
        color="#55a868",
        label="goodput",
    )
    b.set_title("Batch goodput (tokens/s in windows that held the SLO)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out: dict, directory: Path, command: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    png = plot(out, directory / "bench.png")
    md = directory / "bench.md"
    md.write_text(markdown(out, command))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["scenario", *(c for c, _ in COLUMNS)])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table_rows(out)
    )
    page = directory / "bench.html"
    page.write_text(
        "<!doctype html><meta charset=utf-8><title>nightshift bench</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:right}td:first-child{text-align:left}</style>"
        f"<h1>nightshift bench</h1><p>SLO: chat ITL p99 ≤ {out['slo']['chat_itl_p99_ms']} ms, "
        f"TTFT p99 ≤ {out['slo']['chat_ttft_p99_ms']} ms</p><p>{html.escape(itl_note(out))}</p>"
        f"<p><code>{html.escape(command)}"
        f"</code></p><table><tr>{head}</tr>{body}</table><img src='{png.name}' width=1000>"
        f"<pre>{html.escape(json.dumps(out['summary'], indent=2))}</pre>"
    )
    return md, page
