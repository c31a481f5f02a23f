"""A chat-template model gets the BOS its own processor path gives it, no more: through the API, one server.

The checkpoint's tokenizer defines a BOS (`<|endoftext|>`) that it does not add and its chat template
does not write. Hugging Face's processor path (`apply_chat_template(..., tokenize=True)`, then
`generate`; `tests/test_vlm_families_host.hf_reply`) has no BOS there; the host used to prepend one
(text-generation-webui's `add_bos_token`, which its instruct modes turn off for templates, as this
host's chat now does). A sequence of requests through `/v1/chat/completions`, prefix cache on: a chat
with a picture, its second turn, then a new chat with another picture.
"""
from __future__ import annotations

from fixtures import api_helpers, vlm_families
from tests.test_vlm_families_host import NEW_TOKENS, check, hf_reply, png


def test_a_bos_that_neither_the_tokenizer_nor_the_template_writes_is_not_added(tmp_path):
    folder = vlm_families.build_qwen2_5_vl(tmp_path / "qwen_bos", bos="<|endoftext|>")
    first, other = png(64, 48, 31), png(48, 64, 32)
    with api_helpers.serving(folder, ["multimodal"]) as api:
        from modules import shared

        assert shared.tokenizer.bos_token == "<|endoftext|>"
        assert shared.tokenizer("hi")["input_ids"][0] != shared.tokenizer.bos_token_id, "the tokenizer adds it"

        def ask(messages):
            return api.client().chat.completions.create(model="any", messages=messages, max_tokens=NEW_TOKENS,
                                                        temperature=0).choices[0].message.content

        def user(text, pictures):
            return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": api_helpers.data_url(p)}}
                                                for p in pictures] + [{"type": "text", "text": text}]}

        reply = ask([user("What is in the picture?", [first])])
        check([("What is in the picture?", [first], None)], reply)
        follow = [user("What is in the picture?", [first]), {"role": "assistant", "content": reply},
                  user("And the colours?", [])]
        assert ask(follow) == hf_reply([("What is in the picture?", [first], reply), ("And the colours?", [], None)])
        check([("And this one?", [other], None)], ask([user("And this one?", [other])]))
