"""`safe_get`, the host's guarded URL fetcher, under the module name text-generation-webui gives it.

Today's text-generation-webui keeps its fetcher that refuses private addresses in
`modules/web_search.py`, next to its web search, and extensions fetch URLs through it:
`from modules.web_search import safe_get` (the multimodal extension's `native_media.fetch` does,
and refuses every URL in a host without it). This host has no web search; the module holds only that
entry point, with text-generation-webui's signature, and runs the API's one fetcher
(`modules.api.image_fetch.fetch_guarded`) under the API's settings from `shared.args`: the same
address check (`--api-allow-private-urls` lifts it for both), the same hand-checked redirects and
the API's per-image byte cap.

Unlike text-generation-webui's, `timeout` bounds the whole fetch, redirects included, and every
failure, a refused address included, raises `APIError` with the cause in its message. Call it from
a thread without a running event loop (it starts one); async code awaits `fetch_guarded` instead.
"""
from __future__ import annotations

import dataclasses

import anyio

from modules import shared
from modules.api.config import config_from_args
from modules.api.image_fetch import Fetched, fetch_guarded


def safe_get(url: str, headers: dict[str, str] | None = None, timeout: float = 10,
             max_redirects: int = 5) -> Fetched:
    """GET `url`: the final answer's `.status_code`, `.content`, `.text` and `.raise_for_status()`."""
    config = dataclasses.replace(config_from_args(shared.args), fetch_timeout_s=float(timeout),
                                 max_redirects=max_redirects)
    return anyio.run(fetch_guarded, url, config, headers)
