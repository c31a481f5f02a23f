"""The one tokenizer builder of the tests: a tiny BPE tokenizer trained here with `tokenizers`.

`build_tokenizer(specials, ...)` trains byte-level, SentencePiece-style or Metaspace BPE on the
caller's `corpus` and returns a `PreTrainedTokenizerFast` whose first ids are `specials`, in order.
Training is deterministic, so the same arguments give the same vocabulary and ids every run.
Used by `tests/tiny_models.py` (the Llama/LLaVA tokenizer) and `tests/vlm_families.py` (one per
family). It knows nothing about models or processors; nothing is downloaded.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


def build_tokenizer(specials: list[str], *, bos: str | None, eos: str, pad: str, unk: str | None = None,
                    add_bos: bool = False, style: str = "byte_level", extra: dict[str, str] | list[str] | None = None,
                    chat_template: str, corpus: list[str], vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over `corpus` whose first ids are `specials` (in order).

    style "byte_level": GPT-2/Qwen/Llama-3 style bytes with the split regex; "sentencepiece": Gemma's
    style (spaces become "▁", no pre-split, so runs of newlines merge into one token as in Gemma's
    vocabulary); "metaspace": Llama's and Mistral's (a "▁" also before the start of the text).
    `add_bos`: the tokenizer itself puts `bos` before every encoding. `extra`: tokenizer attributes
    processors read (a dict, e.g. `boi_token`), or a list of further special tokens. `vocab_size`:
    the whole vocabulary, specials included (default: 400 beyond the specials).
    """
    alphabet = [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.BPE(unk_token=unk))
    if style == "byte_level":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    elif style == "sentencepiece":
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.decoder = decoders.Replace("\u2581", " ")
        alphabet = [c if c != " " else "\u2581" for c in alphabet]
    elif style == "metaspace":  # Llama / Mistral: "\u2581" for spaces, and one before the text's start
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        alphabet = [c if c != " " else "\u2581" for c in alphabet]
    else:
        raise ValueError(f"unknown tokenizer style {style!r}; known: byte_level, sentencepiece, metaspace")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size or len(specials) + 400, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(corpus * 4, trainer=trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    named = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "unk_token": unk}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in named.items() if v is not None},
                                   extra_special_tokens=extra or {})
    assert all(fast.convert_tokens_to_ids(s) == i for i, s in enumerate(specials))
    fast.chat_template = chat_template
    return fast
