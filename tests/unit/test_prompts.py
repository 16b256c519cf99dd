"""Prompt layout: the instruction first, the same ids in every prompt of every document."""

import pytest

from pipelines.prompts import INSTRUCTION, PromptKit
from serving.tokenizer import LocalTokenizer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> LocalTokenizer:
    """A small byte-level BPE trained on prompt-like text, loaded the way a model's is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [INSTRUCTION, "DOCUMENT:\n", "SECTION:\n", "Summary of the document:"] * 20
    text += ["The parties agree that the amounts below are final.\n\n"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    folder = tmp_path_factory.mktemp("bpe")
    tok.save(str(folder / "tokenizer.json"))
    return LocalTokenizer(folder)


DOCS = (
    "\n\nThe parties agree that the amounts below are final. Amount: 1,200 EUR.",
    "Shorter text, on another subject entirely; no shared opening with the first.",
)


@pytest.mark.parametrize("kind", ["whole", "section"])
def test_the_instruction_is_an_identical_prefix_across_documents(bpe, kind: str) -> None:
    kit = PromptKit.build(bpe)
    build = kit.whole if kind == "whole" else kit.section
    head, tail = (
        (kit.whole_head, kit.whole_tail)
        if kind == "whole"
        else (kit.section_head, kit.section_tail)
    )
    docs = [bpe.encode(d) for d in DOCS]
    assert docs[0] != docs[1]
    prompts = [build(d) for d in docs]
    n = len(kit.instruction)
    assert n > 0 and all(p[:n] == list(kit.instruction) for p in prompts)
    assert kit.instruction == tuple(bpe.encode(INSTRUCTION))  # the instruction, tokenized alone
    for p, d in zip(prompts, docs, strict=True):
        # instruction, head, then the document's own ids untouched, then the tail
        assert p == [*kit.instruction, *head, *d, *tail]
    overhead = kit.whole_overhead if kind == "whole" else kit.section_overhead
    assert all(len(p) == len(d) + overhead for p, d in zip(prompts, docs, strict=True))


def test_tokenizing_the_joined_text_would_not_keep_the_prefix(bpe) -> None:
    """Why prompts are assembled from ids: the instruction's trailing blank line tokenizes
    differently once text follows it, so a prompt tokenized as text would not start with the
    instruction's own ids (and what follows decides how it starts)."""
    kit = PromptKit.build(bpe)
    joined = bpe.encode(INSTRUCTION + "DOCUMENT:\n" + DOCS[0])
    assert joined[: len(kit.instruction)] != list(kit.instruction)
    assert kit.whole(bpe.encode(DOCS[0]))[: len(kit.instruction)] == list(kit.instruction)


def test_whole_section_and_reduce_prompts_all_start_with_the_same_instruction(bpe) -> None:
    kit = PromptKit.build(bpe)
    doc = bpe.encode(DOCS[0])
    prompts = [kit.whole(doc), kit.section(doc[:5]), kit.reduce([doc[:3], doc[3:9]])]
    n = len(kit.instruction)
    assert {tuple(p[:n]) for p in prompts} == {kit.instruction}
    assert len(prompts[2]) == kit.reduce_size([doc[:3], doc[3:9]])
