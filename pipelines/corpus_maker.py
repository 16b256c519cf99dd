"""The sample corpus: long documents that look like tonight's real ones, of known token lengths.

A document has a title, a reference line and numbered sections with headings; each section's
paragraphs are sentences sampled from the text the local models' tokenizer was trained on
(`serving/model_text/`), opened by a fact sentence of the document's kind (`corpus_kinds`: parties,
dates, amounts, systems), so that a summary has something to be faithful to and no two documents are
alike. Every document is measured with the served model's tokenizer and cut to within 1% of its
target length (at a sentence end where the range allows, else at a word), so a corpus of "8k to 80k
tokens" means exactly that to the engine.

Everything is drawn from generators seeded by `(seed, document index)`: the same seed gives the same
corpus, byte for byte, and one document does not change when the corpus grows.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.corpus import corpus_format
from pipelines.corpus_kinds import (
    KINDS,
    DocKind,
    draw_cast,
    draw_date,
    draw_figures,
    pick,
    section_heading,
)
from serving.paths import REPO_ROOT
from serving.tokenizer import Tokenizer

TEXT_DIR = REPO_ROOT / "serving" / "model_text"
MIN_DOC_TOKENS = 128
"""Smallest target: room for a title, a reference line and one section."""
MAX_DRAFTS = 4
"""Drafts of one document before its longest is cut; the first is long enough in practice."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\S+")
_SENTENCE_CLOSE = re.compile(r"(?<=[a-z])[.!?](?=\s|$)")


@dataclass(frozen=True)
class CorpusSpec:
    """What to generate."""

    docs: int = 100
    """Number of documents."""
    min_tokens: int = 8_000
    """Shortest target length, in the served model's tokens."""
    max_tokens: int = 80_000
    """Longest target length, in the served model's tokens."""
    seed: int = 0
    """Seed of every random choice; the same seed gives the same corpus."""
    tolerance: float = 0.01
    """Largest relative miss of a document's length against its target."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field and the fix."""
        if self.docs < 1:
            raise ValueError(f"docs must be at least 1, got {self.docs}")
        if self.min_tokens < MIN_DOC_TOKENS:
            raise ValueError(
                f"min_tokens must be at least {MIN_DOC_TOKENS} (room for a title and "
                f"a section), got {self.min_tokens}"
            )
        if self.max_tokens < self.min_tokens:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) is below min_tokens "
                f"({self.min_tokens}): raise max_tokens or lower min_tokens"
            )
        if not 0 < self.tolerance < 0.5:
            raise ValueError(f"tolerance must be in (0, 0.5), got {self.tolerance}")


@dataclass(frozen=True)
class SampleDoc:
    """One sample document and what is known about it."""

    doc_id: str
    text: str
    tokens: int
    meta: dict


def target_lengths(spec: CorpusSpec) -> list[int]:
    """Target token lengths: log-uniform over [min_tokens, max_tokens], stratified, shuffled.

    Log-uniform because long-document corpora are right-skewed (many short documents, a tail of long
    ones) and because it gives every octave the same share: the short documents that run `whole`
    and the 80k ones whose late chunks are dominated by attention are both well represented. A
    lognormal clipped to the range would pile documents onto the clip points instead. One draw per
    equal-probability stratum makes even a corpus of five span the whole range."""
    rng = np.random.default_rng([spec.seed, 0])
    u = (np.arange(spec.docs) + rng.random(spec.docs)) / spec.docs
    rng.shuffle(u)
    lo, hi = math.log(spec.min_tokens), math.log(spec.max_tokens)
    lengths = np.rint(np.exp(lo + u * (hi - lo))).astype(int)
    return np.clip(lengths, spec.min_tokens, spec.max_tokens).tolist()


def load_sentences(text_dir: Path = TEXT_DIR) -> tuple[str, ...]:
    """Every sentence of the `.txt` files under `text_dir`, in file and reading order."""
    files = sorted(text_dir.glob("*.txt"))
    sentences = [s.strip() for f in files for s in _SENTENCE_END.split(f.read_text("utf-8"))]
    sentences = [s for s in sentences if s]
    if not sentences:
        raise FileNotFoundError(
            f"no sentences under {text_dir}: the sample corpus is built from its "
            ".txt files; restore serving/model_text/ from the repository"
        )
    return tuple(sentences)


def make_corpus(
    spec: CorpusSpec,
    tokenizer: Tokenizer,
    sentences: Sequence[str] | None = None,
    on_doc: Callable[[SampleDoc], None] | None = None,
) -> list[SampleDoc]:
    """All documents of `spec`, each trimmed to its target length in `tokenizer`'s tokens."""
    spec.validate()
    pool = tuple(sentences) if sentences is not None else load_sentences()
    docs = []
    for index, target in enumerate(target_lengths(spec)):
        doc = make_document(index, target, spec, pool, tokenizer)
        docs.append(doc)
        if on_doc is not None:
            on_doc(doc)
    return docs


def make_document(
    index: int, target: int, spec: CorpusSpec, sentences: Sequence[str], tokenizer: Tokenizer
) -> SampleDoc:
    """Document number `index` (0-based) of the corpus, about `target` tokens long."""
    rng = np.random.default_rng([spec.seed, index + 1])
    kind = KINDS[int(rng.integers(len(KINDS)))]
    cast = draw_cast(rng)
    title = pick(rng, kind.titles).format(**cast, **draw_figures(rng))
    n_sections = max(1, round(math.sqrt(target) / 10))
    lo = max(spec.min_tokens, math.ceil(target * (1 - spec.tolerance)))
    hi = min(spec.max_tokens, math.floor(target * (1 + spec.tolerance)))
    # Draft past the target, then cut back: cutting is exact, while the draft's length is only
    # estimated piece by piece, so a draft that falls short is redone with a larger goal.
    goal = float(hi)
    count = _memo_counts(tokenizer)
    for _ in range(MAX_DRAFTS):
        draft = _draft(title, kind, cast, n_sections, goal, rng, sentences, count)
        ids = tokenizer.encode(draft)
        if len(ids) > hi:
            break
        goal *= 1.25
    text, tokens = fit_to_tokens(draft, target, lo, hi, tokenizer, ids)
    meta = {
        "kind": kind.name,
        "title": title,
        "target_tokens": target,
        "tokens": tokens,
        "sections": n_sections,
        "seed": spec.seed,
    }
    return SampleDoc(f"doc-{index + 1:05d}", text, tokens, meta)


def _draft(
    title: str,
    kind: DocKind,
    cast: dict,
    n_sections: int,
    goal: float,
    rng: np.random.Generator,
    sentences: Sequence[str],
    count: Callable[[str], int],
) -> str:
    """Title, reference line and sections, each section given an equal share of the `goal`."""
    reference = f"{kind.name.capitalize()} {cast['ref']}, dated {draw_date(rng)}."
    blocks = [title, reference]
    used = count(title + "\n\n" + reference)
    start = used
    for s in range(n_sections):
        heading = section_heading(kind, s)
        blocks.append(heading)
        used += count(heading) + 1
        section_goal = start + (goal - start) * (s + 1) / n_sections
        fact = pick(rng, kind.facts).format(**cast, **draw_figures(rng))
        paragraphs, used = _section(fact, used, section_goal, rng, sentences, count)
        blocks.extend(paragraphs)
    return "\n\n".join(blocks)


def _section(
    fact: str,
    used: float,
    goal: float,
    rng: np.random.Generator,
    sentences: Sequence[str],
    count: Callable[[str], int],
) -> tuple[list[str], float]:
    """Paragraphs of three to six sentences, opened by `fact`, until `used` reaches `goal`.

    Sentence by sentence, so that a short document's sections stay short and the later ones are
    not cut away; a paragraph ends early when the section is full."""
    paragraphs, current, size = [], [fact], int(rng.integers(3, 7))
    used += count(fact) + 1
    while used < goal:
        sentence = sentences[int(rng.integers(len(sentences)))]
        current.append(sentence)
        used += count(sentence)  # the joining space merges into the next word
        if len(current) == size:
            paragraphs.append(" ".join(current))
            current, size = [], int(rng.integers(3, 7))
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs, used


def fit_to_tokens(
    text: str, target: int, lo: int, hi: int, tokenizer: Tokenizer, ids: list[int] | None = None
) -> tuple[str, int]:
    """`text` cut to a length in [lo, hi] tokens, ending as a sentence, and that length.

    The first cut comes from decoding the first `target` tokens. The end of the sentence before it
    is taken when that lands in range (a long document's range is wide); otherwise whole words are
    added or dropped until the length does. Where one word costs more tokens than the range is
    wide (a date, a number, in a short document) the cut moves into that word, one character at a
    time. A text too short to reach `lo` is returned whole; the closest cut otherwise. `ids`, when
    given, are `text`'s tokens, already counted by the caller."""
    ends = [m.end() for m in _WORD.finditer(text)]
    i = _first_cut(text, ends, target, tokenizer, ids)
    sentence_end = _sentence_end_before(text, ends[i])
    if sentence_end is not None:
        n = _cut_tokens(text, sentence_end, tokenizer)
        if lo <= n <= hi:
            return text[:sentence_end], n
    tried: dict[int, int] = {}
    while 0 <= i < len(ends) and i not in tried:
        n = tried[i] = _cut_tokens(text, ends[i], tokenizer)
        if lo <= n <= hi:
            return _close(text[: ends[i]]), n
        i += 1 if n < lo else -1
    under = [k for k, n in tried.items() if n < lo]
    over = [k for k, n in tried.items() if n > hi]
    if under and over:  # the range falls inside one word: cut within it
        for pos in range(ends[max(under)] + 1, ends[min(over)]):
            n = _cut_tokens(text, pos, tokenizer)
            if lo <= n <= hi:
                return _close(text[:pos]), n
    k = min(tried, key=lambda k: abs(tried[k] - target))
    return _close(text[: ends[k]]), tried[k]


def _memo_counts(tokenizer: Tokenizer) -> Callable[[str], int]:
    """Token counts that remember: a long draft draws the same few dozen sentences thousands of
    times, and counting each only once is most of the speed of drafting."""
    memo: dict[str, int] = {}

    def count(piece: str) -> int:
        if piece not in memo:
            memo[piece] = len(tokenizer.encode(piece))
        return memo[piece]

    return count


def _cut_tokens(text: str, pos: int, tokenizer: Tokenizer) -> int:
    return len(tokenizer.encode(_close(text[:pos])))


def _first_cut(
    text: str, ends: list[int], target: int, tokenizer: Tokenizer, ids: list[int] | None
) -> int:
    """Index of the last word that ends within the first `target` tokens."""
    ids = tokenizer.encode(text) if ids is None else ids
    if len(ids) <= target:
        return len(ends) - 1
    prefix = tokenizer.decode(ids[:target])
    i = int(np.searchsorted(ends, len(prefix), side="right")) - 1
    return max(i, 0)


def _sentence_end_before(text: str, pos: int) -> int | None:
    """End of the last sentence that closes at or before `pos` (not a heading's number)."""
    found = None
    for m in _SENTENCE_CLOSE.finditer(text, max(0, pos - 2_000), pos + 1):
        found = m.end()
    return found


def _close(text: str) -> str:
    """A cut text ending as a sentence would."""
    text = text.rstrip(" \n,;:-")
    return text if text.endswith((".", "!", "?")) else text + "."


# --- output ----------------------------------------------------------------------------------------


def corpus_table(docs: Sequence[SampleDoc]) -> pa.Table:
    """The documents as a corpus table: `doc_id`, `text`, `meta` (a JSON object per row)."""
    return pa.table(
        {
            "doc_id": pa.array([d.doc_id for d in docs], pa.string()),
            "text": pa.array([d.text for d in docs], pa.string()),
            "meta": pa.array([json.dumps(d.meta) for d in docs], pa.string()),
        }
    )


def write_corpus(docs: Sequence[SampleDoc], path: Path | str) -> Path:
    """Write Parquet or JSONL (optionally gzipped) by the path's extension; same docs, same bytes."""
    path = Path(path)
    fmt = corpus_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(corpus_table(docs), path)
        return path
    lines = "".join(
        json.dumps({"doc_id": d.doc_id, "text": d.text, "meta": d.meta}) + "\n" for d in docs
    ).encode("utf-8")
    if path.name.lower().endswith(".gz"):
        # mtime=0 and no file name in the header keep the bytes a function of the documents alone.
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) as f,
        ):
            f.write(lines)
    else:
        path.write_bytes(lines)
    return path
