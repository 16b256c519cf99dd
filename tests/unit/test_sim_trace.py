"""Trace CSV parsing (Azure format), its error messages, and rescaling in time and tokens
(simulator/trace.py, the one reader the simulator and the real chat load share)."""

from __future__ import annotations

import pytest

from simulator.trace import (
    TraceError,
    TraceRow,
    mean_rate,
    parse_timestamp,
    parse_trace,
    read_trace,
    scale_trace,
)

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.1234567,879,0
"""


def test_azure_rows_are_relative_to_the_first_and_keep_all_seven_fraction_digits() -> None:
    rows = parse_trace(AZURE.splitlines(keepends=True))
    assert [r.t_s for r in rows][0] == 0.0
    assert rows[1].t_s == pytest.approx(4.314579, abs=1e-6)
    assert rows[2].t_s == pytest.approx(4.4428667, abs=1e-6)
    assert [(r.context_tokens, r.generated_tokens, r.line) for r in rows] == [
        (374, 44, 2),
        (396, 109, 3),
        (879, 0, 4),
    ]


def test_plain_seconds_without_header_and_unsorted_rows() -> None:
    rows = parse_trace(["10.5,100,5\n", "3.0,200,6\n", "4,300,7\n"])
    assert [(r.t_s, r.context_tokens) for r in rows] == [(0.0, 200), (1.0, 300), (7.5, 100)]
    assert rows[0].line == 2


def test_timestamps_keep_every_fraction_digit_and_say_their_kind() -> None:
    a, kind = parse_timestamp("2023-11-16 18:15:46.6805900")
    b, _ = parse_timestamp("2023-11-16T18:15:47.1")
    assert kind == "datetime" and b - a == pytest.approx(0.41941, abs=1e-6)
    assert parse_timestamp("12.5") == (12.5, "seconds")


def test_header_may_order_columns_freely() -> None:
    rows = parse_trace(["GeneratedTokens,TIMESTAMP,ContextTokens\n", "9,1.0,50\n", "8,2.0,60\n"])
    assert [(r.t_s, r.context_tokens, r.generated_tokens) for r in rows] == [(0, 50, 9), (1, 60, 8)]


@pytest.mark.parametrize(
    ("bad_row", "words"),
    [
        ("2023-11-16 18:15:52.1,12", "expected 3 columns"),
        ("yesterday,12,3", "neither seconds"),
        ("2023-13-16 18:15:52.1,12,3", "not a valid date"),
        ("5.0,twelve,3", "ContextTokens 'twelve' is not a whole number"),
        ("5.0,12,-3", "GeneratedTokens is negative"),
        ("5.0,0,3", "at least 1 token"),
        ("nan,12,3", "not a finite number"),
    ],
)
def test_malformed_row_names_its_line(bad_row: str, words: str) -> None:
    text = f"TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,2\n\n{bad_row}\n2.0,10,2\n"
    with pytest.raises(TraceError, match=f"chat.csv:4: .*{words}"):
        parse_trace(text.splitlines(keepends=True), source="chat.csv")


def test_a_row_without_a_header_is_exactly_the_three_columns() -> None:
    with pytest.raises(TraceError, match="t:2: expected 3 columns .*got 4"):
        parse_trace(["1.0,10,2\n", "2.0,10,2,7\n"], source="t")
    named = parse_trace(["TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n", "2.0,10,2,7\n"])
    assert [(r.context_tokens, r.generated_tokens) for r in named] == [(10, 2)]


def test_mixed_timestamp_kinds_are_refused_at_the_first_odd_row() -> None:
    lines = ["2023-11-16 18:15:46.1,10,2\n", "1700000000.0,10,2\n"]
    with pytest.raises(
        TraceError, match=r"t:2: TIMESTAMP is seconds but earlier rows are datetime"
    ):
        parse_trace(lines, source="t")


def test_header_missing_a_column_and_empty_trace() -> None:
    with pytest.raises(TraceError, match="header lacks GeneratedTokens"):
        parse_trace(["TIMESTAMP,ContextTokens\n"])
    with pytest.raises(TraceError, match="no request rows"):
        parse_trace(["TIMESTAMP,ContextTokens,GeneratedTokens\n", "\n"])


def test_read_trace_from_file_with_byte_order_mark(tmp_path) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(b"\xef\xbb\xbf" + AZURE.encode())
    assert len(read_trace(path)) == 3
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.csv")


def test_a_file_read_and_sped_up_starts_at_its_earliest_row(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.0000000,100,10\n"
        "2023-11-16 18:15:46.0000000,2000,0\n"
    )
    rows = scale_trace(read_trace(path), speedup=2.0)  # an empty answer still asks for one token
    assert [(r.t_s, r.context_tokens, r.generated_tokens, r.line) for r in rows] == [
        (0.0, 2000, 1, 3),
        (2.0, 100, 10, 2),
    ]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,100,10\n2.0,abc,10\n")
    with pytest.raises(
        TraceError, match=r"trace\.csv:3: ContextTokens 'abc' is not a whole number"
    ):
        read_trace(path)


def rows(times: list[float], ctx: int = 1000, gen: int = 100) -> list[TraceRow]:
    return [TraceRow(t, ctx, gen) for t in times]


def test_speedup_compresses_time_and_token_scale_shrinks_sizes() -> None:
    scaled = scale_trace(rows([0.0, 2.0, 6.0], ctx=1000, gen=3), speedup=2.0, token_scale=0.1)
    assert [r.t_s for r in scaled] == [0.0, 1.0, 3.0]
    assert [(r.context_tokens, r.generated_tokens) for r in scaled] == [(100, 1)] * 3


def test_target_rate_rescales_the_mean_rate_exactly() -> None:
    trace = rows([0.0, 1.0, 1.5, 7.0, 9.0])
    assert mean_rate(trace) == pytest.approx(4 / 9)
    assert mean_rate(scale_trace(trace, rate=2.0)) == pytest.approx(2.0)


def test_start_offset_rebases_the_window() -> None:
    scaled = scale_trace(rows([0.0, 5.0, 8.0, 12.0]), start_s=6.0)
    assert [r.t_s for r in scaled] == [0.0, 4.0]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"speedup": 2.0, "rate": 1.0}, "not both"),
        ({"speedup": 0.0}, "speed-up must be a positive"),
        ({"rate": -1.0}, "rate must be positive"),
        ({"token_scale": 0.0}, "token scale must be positive"),
        ({"start_s": 100.0}, "no rows after 100 s"),
    ],
)
def test_bad_scaling_is_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(TraceError, match=words):
        scale_trace(rows([0.0, 1.0]), **kwargs)


def test_target_rate_needs_a_time_span() -> None:
    with pytest.raises(TraceError, match="two distinct arrival times"):
        scale_trace(rows([3.0]), rate=1.0)
