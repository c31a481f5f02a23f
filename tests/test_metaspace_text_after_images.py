"""Text after a picture, with a Llama/Mistral-style tokenizer (Metaspace: a "▁" before the text's start).

The embedder encodes the prompt's text in parts, between pictures. Encoded alone, the part after a
picture got a "▁" that the whole prompt (Hugging Face's processor, one string) does not have: every
reply differed from the first token on such checkpoints (llava-1.5-7b-hf's tokenizer is one; found on
an independently built llava-hf folder). Here: a Mistral 3 checkpoint with that tokenizer, three turns
through `/v1/chat/completions` on one server (a new picture on turn 3, prefix cache on), each reply
equal to Hugging Face's and shown to depend on the pictures.
"""
from __future__ import annotations

from fixtures import vlm_families
from tests.test_vlm_families_host import three_turns_through_the_api


def test_text_after_a_picture_is_tokenized_as_in_the_whole_prompt(tmp_path):
    folder = vlm_families.build_mistral3(tmp_path / "mistral3_metaspace", tokenizer_style="metaspace")
    tokenizer = vlm_families.PreTrainedTokenizerFast.from_pretrained(folder)
    assert tokenizer("a")["input_ids"] != tokenizer("<s>a", add_special_tokens=False)["input_ids"][1:], \
        "the tokenizer writes no leading '▁': this checks nothing"
    three_turns_through_the_api(folder)
