"""The streamed reply: its text built a few ids at a time (`modules/reply_text.py`), and the token ids
handed from the generating thread, merged when the consumer fell behind or waits out its update
interval (`text_generation.merged_tokens`, `max_updates_second`).

The tokenizers are real (fixtures/tiny_tokenizer.py, in the three styles the families use: byte-level,
SentencePiece-like and Metaspace, which drops the leading space of a decoded text's first id), and the
replies hold what breaks naive incremental decoding: characters of several bytes (ids that decode to
U+FFFD alone), spaces at id boundaries, runs of newlines.
"""
from __future__ import annotations

import queue
import threading
import time

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


def timed_tokens(q: queue.SimpleQueue, first_taken: threading.Event, count: int) -> None:
    """The generating thread's pace: token 0, then (once the consumer has it) one token a millisecond."""
    q.put([0])
    first_taken.wait(5)
    for token in range(1, count):
        time.sleep(0.001)
        q.put([token])
    q.put(None)


@pytest.mark.parametrize("interval", [0.0, 0.03])
def test_tokens_come_at_most_once_an_interval_the_first_at_once(interval):
    q: queue.SimpleQueue = queue.SimpleQueue()
    first_taken = threading.Event()
    producer = threading.Thread(target=timed_tokens, args=(q, first_taken, 60))
    producer.start()
    started = time.perf_counter()
    lists = []
    for item in merged_tokens(q, interval):
        lists.append(item)
        first_taken.set()
    elapsed = time.perf_counter() - started
    producer.join()
    assert lists[0] == [0], "the first token is handed out as soon as it comes"
    assert [t for item in lists for t in item] == list(range(60))
    if interval:
        assert len(lists) <= elapsed / interval + 2, (len(lists), elapsed)
    else:
        assert len(lists) > 20, "without an interval the consumer wakes for (nearly) every token"


def test_the_last_tokens_are_not_held_back_once_the_producer_ended():
    """Tokens that came in the update interval after the last hand-out go out when the producer ends,
    not when the interval does (here 5 s)."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    ended = threading.Event()

    def produce():
        q.put([0])
        time.sleep(0.05)
        q.put([1])
        q.put(None)
        ended.set()

    producer = threading.Thread(target=produce)
    started = time.perf_counter()
    producer.start()
    lists = list(merged_tokens(q, 5.0, ended))
    elapsed = time.perf_counter() - started
    producer.join()
    assert lists == [[0], [1]] and elapsed < 2, elapsed
