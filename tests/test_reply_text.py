"""The streamed reply: its text built a few ids at a time (`modules/reply_text.py`), and the token ids
handed from the generating thread, merged when the consumer fell behind (`text_generation.merged_tokens`).

The tokenizers are real (fixtures/tiny_tokenizer.py, in the three styles the families use: byte-level,
SentencePiece-like and Metaspace, which drops the leading space of a decoded text's first id), and the
replies hold what breaks naive incremental decoding: characters of several bytes (ids that decode to
U+FFFD alone), spaces at id boundaries, runs of newlines.
"""
from __future__ import annotations

import queue

import pytest

from fixtures import tiny_tokenizer, vlm_families
from modules.reply_text import ReplyText
from modules.text_generation import PromptReady, merged_tokens

REPLIES = ["It is a red circle. And this one?\n\n\nA blue square, yes.",
           " Déjà vu: naïve café — 3 × 4 ≈ 12 🙂 ok",
           "  two spaces, then\ttab and émoji 🙂🙂 at the end 🙂"]


@pytest.mark.parametrize("style", ["byte_level", "sentencepiece", "metaspace"])
def test_the_streamed_text_grows_to_the_whole_decode(style):
    tokenizer = tiny_tokenizer.build_tokenizer(["<s>", "</s>", "<pad>"], bos="<s>", eos="</s>", pad="<pad>",
                                               unk=None if style == "byte_level" else "<pad>", style=style,
                                               chat_template="", corpus=vlm_families.CORPUS)
    for text in REPLIES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        reply = ReplyText(lambda part: tokenizer.decode(part, skip_special_tokens=True))
        steps = [reply.add([i]) for i in ids]
        assert all(whole.startswith(step) and not step.endswith("\ufffd") for step in steps), (style, text, steps)
        assert steps[-1] == whole and reply.finish() == whole


def test_the_text_is_decoded_a_few_ids_at_a_time():
    decoded: list[int] = []

    def decode(ids):
        decoded.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    reply = ReplyText(decode)
    for i in range(200):
        reply.add([i])
    assert max(decoded) <= 2 and reply.text == decode(list(range(200)))


def events(*items) -> queue.SimpleQueue:
    q: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        q.put(item)
    return q


def test_token_lists_already_queued_come_as_one():
    error = RuntimeError("boom")
    assert list(merged_tokens(events(PromptReady(5), [1], [2, 3], [4], None))) == [PromptReady(5), [1, 2, 3, 4]]
    assert list(merged_tokens(events([1], [2], error, None))) == [[1, 2], error]
    assert list(merged_tokens(events([1], PromptReady(2), [3], None))) == [[1], PromptReady(2), [3]]
    assert list(merged_tokens(events(None))) == []
