"""The corpus reader, its refusals, the per-document checks, and the sample-corpus generator."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipelines.corpus import (
    COLUMNS,
    CorpusError,
    DocProblem,
    classify,
    count_tokens,
    document_texts,
    read_corpus,
)
from pipelines.corpus_maker import (
    KINDS,
    CorpusSpec,
    fit_to_tokens,
    load_sentences,
    make_corpus,
    target_lengths,
    write_corpus,
)
from serving.engine_config import load_engine_config
from serving.paths import REPO_ROOT, SetupError
from serving.tokenizer import tokenizer_for

SMALL = CorpusSpec(docs=8, min_tokens=300, max_tokens=3000, seed=11)


class ByteTokenizer:
    """One token per UTF-8 byte: a tokenizer whose counts are obvious, needing no model files."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def served_tokenizer():
    """The small local model's tokenizer, as the served model counts."""
    try:
        return tokenizer_for(load_engine_config(REPO_ROOT / "engine_configs" / "cpu-small.yaml"))
    except (SetupError, FileNotFoundError) as exc:
        pytest.skip(f"local model not built ({exc}); run `make models`")


@pytest.fixture(scope="module")
def small_docs(served_tokenizer):
    return make_corpus(SMALL, served_tokenizer)


def write_jsonl(path: Path, lines: list[bytes | str]) -> Path:
    raw = b"".join((x.encode() if isinstance(x, str) else x) + b"\n" for x in lines)
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def verdicts(table: pa.Table, limit: int | None = None, tokens=None) -> list[DocProblem | None]:
    counts = tokens if tokens is not None else count_tokens(table, ByteTokenizer())
    return classify(table, limit, counts)


# --- reading ---------------------------------------------------------------------------------------


def test_reads_parquet_and_merges_metadata(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table(
            {
                "doc_id": [1, 2],
                "text": ["alpha", "beta"],
                "meta": [{"kind": "lease"}, None],
                "source": ["a", "b"],
            }
        ),
        path,
    )
    table = read_corpus(path)
    assert table.column_names == list(COLUMNS)
    assert table.column("doc_id").to_pylist() == ["1", "2"]
    assert table.column("text").type == pa.string()
    assert json.loads(table.column("meta")[0].as_py()) == {"kind": "lease", "source": "a"}
    assert json.loads(table.column("meta")[1].as_py()) == {"source": "b"}
    assert table.column("problem").to_pylist() == [None, None]


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_reads_jsonl_plain_and_gzipped(tmp_path: Path, name: str) -> None:
    path = write_jsonl(
        tmp_path / name,
        [
            json.dumps({"doc_id": "d1", "text": "first", "meta": {"kind": "memo"}, "lang": "en"}),
            "",
            json.dumps({"doc_id": "d2", "text": "second"}),
        ],
    )
    table = read_corpus(path)
    assert table.column("doc_id").to_pylist() == ["d1", "d2"]
    assert document_texts(table) == ["first", "second"]
    assert json.loads(table.column("meta")[0].as_py()) == {"kind": "memo", "lang": "en"}
    assert table.column("meta")[1].as_py() is None


def test_invalid_utf8_in_jsonl_keeps_the_raw_bytes(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [b'{"doc_id": "ok", "text": "fine"}', b'{"doc_id": "bad", "text": "caf\xe9 au lait"}'],
    )
    table = read_corpus(path)
    assert table.column("text").type == pa.binary()
    assert table.column("text")[1].as_py() == b"caf\xe9 au lait"
    assert document_texts(table) == ["fine", None]
    assert verdicts(table) == [None, DocProblem("failed", "text is not valid UTF-8 (byte 3)")]


def test_bad_jsonl_lines_become_rows_with_problems(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [
            '{"doc_id": "a", "text": "x"}',
            "{not json",
            "[1, 2]",
            '{"text": "no id"}',
            '{"doc_id": "b"}',
            '{"doc_id": "c", "text": 5}',
            '{"doc_id": 7, "text": "numbered"}',
        ],
    )
    table = read_corpus(path)
    assert table.column("doc_id").to_pylist() == ["a", "line-2", "line-3", "line-4", "b", "c", "7"]
    reasons = [v and v.reason for v in verdicts(table)]
    assert reasons[0] is None and reasons[6] is None
    assert reasons[1].startswith("line 2 is not valid JSON")
    assert reasons[2] == "line 3 is a JSON list, not an object"
    assert reasons[3] == "line 4 has no doc_id"
    assert reasons[4] == "no text field"
    assert reasons[5] == "text is a JSON int, not a string"


def test_parquet_binary_text_and_missing_ids(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table(
            {
                "doc_id": ["a", None, "c"],
                "text": pa.array([b"ok", b"fine", b"\xff\xfe"], pa.binary()),
            }
        ),
        path,
    )
    table = read_corpus(path)
    assert table.column("doc_id").to_pylist() == ["a", "row-1", "c"]
    assert verdicts(table) == [
        None,
        DocProblem("failed", "row 1 has no doc_id"),
        DocProblem("failed", "text is not valid UTF-8 (byte 0)"),
    ]


def test_parquet_string_columns_with_invalid_utf8_do_not_crash(tmp_path: Path) -> None:
    """Parquet writers do not validate strings; such a file must still read."""

    def unchecked_strings(values: list[bytes]) -> pa.Array:
        raw = pa.array(values, pa.binary())
        return pa.Array.from_buffers(pa.string(), len(values), raw.buffers())

    path = tmp_path / "c.parquet"
    pq.write_table(
        pa.table(
            {
                "doc_id": unchecked_strings([b"a", b"b\xff"]),
                "text": unchecked_strings([b"fine", b"caf\xe9"]),
            }
        ),
        path,
    )
    table = read_corpus(path)
    assert table.column("doc_id").to_pylist() == ["a", "row-1"]
    assert table.column("text").type == pa.binary()
    assert verdicts(table) == [None, DocProblem("failed", "doc_id in row 1 is not valid UTF-8")]


def test_parquet_binary_text_that_decodes_is_read_as_strings(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"doc_id": ["a"], "text": pa.array([b"plain"], pa.binary())}), path)
    assert read_corpus(path).column("text").type == pa.string()


# --- refusals before any work ----------------------------------------------------------------------


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"nope\.parquet does not exist: check the path"):
        read_corpus(tmp_path / "nope.parquet")


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="is a directory: pass one .parquet or .jsonl file"):
        read_corpus(tmp_path)


def test_unsupported_extension_names_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("doc_id,text\na,b\n")
    with pytest.raises(CorpusError) as err:
        read_corpus(path)
    assert "unsupported extension" in str(err.value)
    assert ".parquet" in str(err.value) and ".jsonl" in str(err.value)


def test_parquet_without_text_lists_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"doc_id": ["a"], "body": ["x"], "title": ["t"]}), path)
    with pytest.raises(CorpusError) as err:
        read_corpus(path)
    message = str(err.value)
    assert "has no `text` column (columns: doc_id, body, title)" in message
    assert "rename" in message


def test_jsonl_without_doc_id_or_text_lists_its_fields(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", ['{"id": 1, "body": "x"}'])
    with pytest.raises(CorpusError, match=r"no `doc_id` or `text` column \(columns: body, id\)"):
        read_corpus(path)


@pytest.mark.parametrize("name", ["c.parquet", "c.jsonl"])
def test_empty_file_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(CorpusError, match="is empty"):
        read_corpus(path)


def test_files_without_documents_are_refused(tmp_path: Path) -> None:
    blank = write_jsonl(tmp_path / "blank.jsonl", ["", "   "])
    with pytest.raises(CorpusError, match="holds no documents"):
        read_corpus(blank)
    no_rows = tmp_path / "none.parquet"
    pq.write_table(
        pa.table({"doc_id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), no_rows
    )
    with pytest.raises(CorpusError, match="holds no documents"):
        read_corpus(no_rows)


def test_non_corpus_contents_are_refused(tmp_path: Path) -> None:
    fake = tmp_path / "c.parquet"
    fake.write_text("doc_id,text\n")
    with pytest.raises(CorpusError, match="not a readable Parquet file"):
        read_corpus(fake)
    csv = write_jsonl(tmp_path / "c.jsonl", ["doc_id,text", "a,b"])
    with pytest.raises(CorpusError, match="no line is a JSON object"):
        read_corpus(csv)
    not_gz = tmp_path / "c.jsonl.gz"
    not_gz.write_text('{"doc_id": "a", "text": "b"}\n')
    with pytest.raises(CorpusError, match="could not be read"):
        read_corpus(not_gz)
    truncated = tmp_path / "t.jsonl.gz"
    truncated.write_bytes(gzip.compress(b'{"doc_id": "a", "text": "b"}\n' * 50)[:40])
    with pytest.raises(CorpusError, match="could not be read"):
        read_corpus(truncated)


def test_non_text_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"doc_id": ["a"], "text": [3]}), path)
    with pytest.raises(CorpusError, match="column `text` has type int64"):
        read_corpus(path)


# --- per-document checks ---------------------------------------------------------------------------


def corpus(rows: list[tuple[str, str | None]]) -> pa.Table:
    return pa.table(
        {
            "doc_id": [r[0] for r in rows],
            "text": [r[1] for r in rows],
            "meta": pa.array([None] * len(rows), pa.string()),
            "problem": pa.array([None] * len(rows), pa.string()),
        }
    )


def test_each_document_problem() -> None:
    table = corpus(
        [
            ("a", "one two"),
            ("b", ""),
            ("c", " \n\t\u3000"),
            ("d", None),
            ("a", "other text"),
            ("e", "x" * 50),
            ("f", "one two"),
            ("g", "fine"),
        ]
    )
    assert verdicts(table, limit=40) == [
        None,
        DocProblem("failed", "empty text"),
        DocProblem("failed", "empty text"),
        DocProblem("failed", "missing text"),
        DocProblem("skipped", "duplicate doc_id (first at row 0)"),
        DocProblem(
            "failed",
            "over-long: 50 tokens > limit 40; raise max_doc_tokens or split the document upstream",
        ),
        DocProblem("skipped", "same text as doc a"),
        None,
    ]


def test_first_row_of_an_id_wins_even_when_it_failed() -> None:
    table = corpus([("a", ""), ("a", "good"), ("a", "good")])
    assert [v and v.status for v in verdicts(table)] == ["failed", "skipped", "skipped"]
    assert verdicts(table)[2].reason == "duplicate doc_id (first at row 0)"


def test_over_long_text_does_not_shadow_a_copy() -> None:
    """A failed document is not 'the original': its copy is judged on its own."""
    table = corpus([("a", "y" * 30), ("b", "y" * 30)])
    assert [v and v.status for v in verdicts(table, limit=10)] == ["failed", "failed"]
    assert verdicts(table, limit=None) == [None, DocProblem("skipped", "same text as doc a")]


def test_token_counts_must_match_rows() -> None:
    with pytest.raises(ValueError, match="token_counts has 1 entries for 2 rows"):
        classify(corpus([("a", "x"), ("b", "y")]), 10, [1])


def test_count_tokens_skips_unusable_text_and_uses_batches() -> None:
    class Batching(ByteTokenizer):
        batches = 0

        def encode_batch(self, texts: list[str]) -> list[list[int]]:
            self.batches += 1
            return [self.encode(t) for t in texts]

    tok = Batching()
    table = corpus([("a", "abc"), ("b", "  "), ("c", None), ("d", "héllo")])
    assert count_tokens(table, tok) == [3, None, None, 6]
    assert tok.batches == 1


# --- the generator ---------------------------------------------------------------------------------


def test_target_lengths_are_deterministic_log_uniform_and_span_the_range() -> None:
    spec = CorpusSpec(docs=40, min_tokens=8_000, max_tokens=80_000, seed=3)
    lengths = target_lengths(spec)
    assert lengths == target_lengths(spec)
    assert lengths != target_lengths(CorpusSpec(docs=40, seed=4))
    assert all(8_000 <= n <= 80_000 for n in lengths)
    stratum = 10 ** (1 / 40)  # each document owns 1/40 of the log range
    assert min(lengths) < 8_000 * stratum and max(lengths) > 80_000 / stratum
    geometric_mean = math.sqrt(8_000 * 80_000)
    assert sum(n < geometric_mean for n in lengths) == 20


def test_spec_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_tokens .* is below min_tokens"):
        CorpusSpec(min_tokens=500, max_tokens=400).validate()
    with pytest.raises(ValueError, match="min_tokens must be at least 128"):
        CorpusSpec(min_tokens=10, max_tokens=400).validate()
    with pytest.raises(ValueError, match="docs must be at least 1"):
        CorpusSpec(docs=0).validate()


def test_fit_cuts_at_a_word_and_lands_in_bounds() -> None:
    text = " ".join(f"word{i}" for i in range(200))
    fitted, n = fit_to_tokens(text, 300, 297, 303, ByteTokenizer())
    assert 297 <= n <= 303 and n == len(fitted.encode())
    assert fitted.endswith(".") and text.startswith(fitted[:-1])
    assert fitted[:-1].split()[-1] in text.split()


def test_documents_hit_their_targets_in_served_tokens(small_docs, served_tokenizer) -> None:
    targets = target_lengths(SMALL)
    for doc, target in zip(small_docs, targets, strict=True):
        assert doc.tokens == len(served_tokenizer.encode(doc.text))
        assert abs(doc.tokens - target) <= 0.01 * target
        assert SMALL.min_tokens <= doc.tokens <= SMALL.max_tokens
        assert doc.meta["target_tokens"] == target and doc.meta["tokens"] == doc.tokens
    assert [d.doc_id for d in small_docs] == [f"doc-{i:05d}" for i in range(1, 9)]


def test_documents_look_like_documents(small_docs) -> None:
    kinds = {k.name for k in KINDS}
    for doc in small_docs:
        blocks = doc.text.split("\n\n")
        assert blocks[0] == doc.meta["title"]
        assert blocks[2].startswith("1. ") and "\n\n2. " in doc.text
        assert doc.meta["kind"] in kinds
        assert doc.text.endswith(".")
    assert len({d.text for d in small_docs}) == len(small_docs)


@pytest.mark.parametrize("name", ["c.parquet", "c.jsonl.gz"])
def test_same_seed_same_bytes(tmp_path: Path, served_tokenizer, small_docs, name: str) -> None:
    again = make_corpus(SMALL, served_tokenizer)
    first = write_corpus(small_docs, tmp_path / "1" / name)
    second = write_corpus(again, tmp_path / "2" / name)
    assert first.read_bytes() == second.read_bytes()
    other = make_corpus(
        CorpusSpec(docs=2, min_tokens=300, max_tokens=400, seed=12), served_tokenizer
    )
    assert other[0].text != again[0].text


def test_written_corpus_reads_back_clean(tmp_path: Path, small_docs, served_tokenizer) -> None:
    table = read_corpus(write_corpus(small_docs, tmp_path / "c.parquet"))
    assert table.column("doc_id").to_pylist() == [d.doc_id for d in small_docs]
    counts = count_tokens(table, served_tokenizer)
    assert counts == [d.tokens for d in small_docs]
    assert classify(table, SMALL.max_tokens, counts) == [None] * len(small_docs)
    assert json.loads(table.column("meta")[0].as_py())["kind"] == small_docs[0].meta["kind"]


def test_sentences_come_from_the_model_text(tmp_path: Path) -> None:
    sentences = load_sentences()
    assert len(sentences) > 20 and all(s[-1] in ".!?\"'" for s in sentences[:10])
    with pytest.raises(FileNotFoundError, match="no sentences under"):
        load_sentences(tmp_path)


# --- the command line ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_make_then_check(tmp_path: Path, served_tokenizer) -> None:
    out = tmp_path / "c.parquet"
    made = runner.invoke(
        app,
        [
            "corpus",
            "make",
            "--docs",
            "3",
            "--min-tokens",
            "200",
            "--max-tokens",
            "400",
            "--out",
            str(out),
            "--seed",
            "5",
        ],
    )
    assert made.exit_code == 0, made.output
    assert "wrote 3 documents" in made.stdout and "tokens: min " in made.stdout
    checked = runner.invoke(app, ["corpus", "check", str(out), "--max-doc-tokens", "300"])
    assert checked.exit_code == 0, checked.output
    assert "3 documents" in checked.stdout


def test_cli_check_lists_problems_and_strict_fails(tmp_path: Path, served_tokenizer) -> None:
    path = write_jsonl(
        tmp_path / "c.jsonl",
        ['{"doc_id": "a", "text": "hello"}', '{"doc_id": "a", "text": "again"}', "oops"],
    )
    result = runner.invoke(app, ["corpus", "check", str(path), "--strict"])
    assert result.exit_code == 1
    assert "ok 1, failed 1, skipped 1" in result.stdout
    assert "a  skipped: duplicate doc_id (first at row 0)" in result.stdout
    assert "line-3  failed: line 3 is not valid JSON" in result.stdout


def test_cli_bad_input_exits_2_with_the_fix(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["corpus", "check", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    bad_range = runner.invoke(
        app,
        [
            "corpus",
            "make",
            "--min-tokens",
            "900",
            "--max-tokens",
            "100",
            "--out",
            str(tmp_path / "c.parquet"),
        ],
    )
    assert bad_range.exit_code == 2
    assert "--max-tokens (100) is below --min-tokens (900)" in bad_range.stderr
    bad_out = runner.invoke(app, ["corpus", "make", "--out", str(tmp_path / "c.txt")])
    assert bad_out.exit_code == 2 and "unsupported extension" in bad_out.stderr
