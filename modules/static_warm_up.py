"""Compiling the static cache's decoding step while the server starts, not in the first reply.

Where the static cache is on for this model before any request says (`--static-cache`, the settings'
`static_cache`, or `static_decode.DEFAULT_ON_CUDA` on a GPU) and transformers compiles its step there
(`static_decode.compiles`), the first reply would wait for that compile: tens of seconds at 7B
(Hugging Face's own took 30 s on an H200). `compile_static_decode` answers a two-token chat turn at
start-up instead, through the host's own chat turn: the same thread, grad mode and inputs as a user's
turn, so the graph it compiles is the one every later reply at that cache length runs
(`tests/test_static_compile.py` counts the graphs). It compiles for the length most chats get
(`static_decode.slots`: MIN_SLOTS, or the context where that is shorter); a chat that outgrows it waits
once more, and the log says so. Where the step cannot compile (no working Triton, say), the warm-up
says why and the static cache is turned off (the `static_cache` setting), so that replies still come.
"""
from __future__ import annotations

import time

from modules import chat, prefix_cache, shared, static_decode
from modules.logging_colors import logger

NEW_TOKENS = 2  # the first step is the prefill (not compiled); the second goes through the compiled one


def compile_static_decode() -> None:
    """Runs the warm-up turn where it would compile; does nothing elsewhere (a CPU, an engine, no model)."""
    if shared.model is None or shared.engine is not None:
        return
    state = chat.new_state(do_sample=False, max_new_tokens=NEW_TOKENS, ban_eos_token=True)
    if not (static_decode.enabled(state) and static_decode.takes_static_cache(shared.model)
            and static_decode.compiles(shared.model)):
        return
    logger.info("Static cache: compiling the decoding step before serving, so that the first reply does not wait")
    started = time.perf_counter()
    try:
        for _ in chat.generate_chat_reply("Hello.", state, loading_message=False):
            pass
    except Exception as error:  # e.g. no working Triton (Windows): serve, with the dynamic cache
        shared.settings["static_cache"] = False
        logger.warning(f"Static cache: the decoding step did not compile ({type(error).__name__}: {error}); "
                       f"replies decode with the dynamic cache")
        return
    finally:
        prefix_cache.clear()  # nobody's prefix
    logger.info(f"Static cache: compiled in {time.perf_counter() - started:.1f} s")
