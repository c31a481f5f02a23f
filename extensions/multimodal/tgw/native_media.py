"""Today's text-generation-webui's own images: `<__media__>` markers in the prompt, the pictures in `state`.

Its chat box stores attached pictures in the history's metadata and writes one `<__media__>` per
picture into the prompt; its OpenAI API writes one per `image_url` part. The pictures reach the
extension in `state`, in the order of the markers, from one of (the precedence its own loaders use):
1. `state['image_attachments']`: `{'type': 'image', 'image_data': 'data:image/...;base64,...'}` for
   every picture of the whole history (the chat box);
2. the `image_url` parts of `state['history']['messages']` (`/v1/chat/completions`);
3. `state['raw_images']`: PIL images (`/v1/completions` with messages).
`media_to_tags` replaces each marker by that picture's history tag (`with_state_pictures` also puts
`/v1/completions`' pictures before a prompt that has no marker), so the rest of the extension
sees one image format; `stand_in_tag` is the tag a marker counts as when a prompt is only measured. When text-generation-webui dropped old turns to fit the context, the prompt
holds fewer markers than the state holds pictures: markers and pictures are matched from the newest.
A picture that cannot be read is refused (ImageDecodeError) when it came with the message being
answered; one of an earlier message, which the user was told about when it was refused, is left out,
so that the chat goes on (text-generation-webui keeps a refused message, and its picture, in its
history).
This module knows nothing about tokens or pipelines.
"""
from __future__ import annotations

from typing import Any, Callable, List

from PIL import Image

from extensions.multimodal.core import notices
from extensions.multimodal.core.history_images import history_max_side, history_tags
from extensions.multimodal.core.image_codec import (DATA_URL_PREFIX, ImageDecodeError, data_url_bytes, has_tag,
                                                    store_image)

MEDIA_MARKER = "<__media__>"
FETCH_TIMEOUT_S = 10
FETCH_MAX_BYTES = 32 * 1024 * 1024


def state_images(state: dict) -> List[Any]:
    """The pictures `state` carries, oldest first: URL strings (data: or http(s):) or PIL images."""
    attachments = [a for a in state.get("image_attachments") or [] if isinstance(a, dict) and a.get("type") == "image"]
    if attachments:
        return [str(a.get("image_data", "")) for a in attachments]
    history = state.get("history")
    messages = history.get("messages") if isinstance(history, dict) else None
    urls = [url for message in messages or [] for url in message_image_urls(message)]
    return urls or list(state.get("raw_images") or [])


def current_pictures(state: dict, pictures: List[Any]) -> int:
    """How many of the newest `pictures` came with the message being answered."""
    history = state.get("history") if isinstance(state.get("history"), dict) else {}
    attachments = [a for a in state.get("image_attachments") or [] if isinstance(a, dict) and a.get("type") == "image"]
    if attachments:  # the chat box: state['history'] is the history before this message, if it is a new one
        rows = len(history.get("internal") or [])
        per_row = [row_images(history, row) for row in range(rows)]
        new = len(attachments) - sum(per_row)
        return new if new > 0 else (per_row[-1] if per_row else len(attachments))
    messages = history.get("messages")
    users = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    if users:  # the API: the request's last user message
        return len(message_image_urls(users[-1]))
    return len(pictures)


def row_images(history: dict, row: int) -> int:
    metadata = history.get("metadata") or {}
    attachments = (metadata.get(f"user_{row}") or {}).get("attachments") or []
    return sum(1 for a in attachments if isinstance(a, dict) and a.get("type") == "image")


def picture_data(picture: Any, label: str) -> Any:
    """Bytes for a URL (decoded or fetched), a PIL image as it is."""
    if not isinstance(picture, str):
        return picture
    if picture.startswith(DATA_URL_PREFIX):
        return data_url_bytes(picture, label)
    if picture.startswith(("http://", "https://")):
        return fetch(picture)
    raise ImageDecodeError(f"Cannot read {label}: unsupported URL {picture[:40]!r}.")


def message_image_urls(message: Any) -> List[str]:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    parts = [part for part in content if isinstance(part, dict) and part.get("type") == "image_url"]
    return [str((part.get("image_url") or {}).get("url", "")) for part in parts]


def fetch(url: str) -> bytes:
    """An http(s) image through the host's own fetcher that refuses private addresses (today's
    text-generation-webui's `safe_get`). A host without one gets a clear refusal, never an unguarded
    fetch: a URL in a request must not make the server reach into its own network."""
    try:
        from modules.web_search import safe_get  # today's text-generation-webui: blocks private addresses
    except ImportError:
        raise ImageDecodeError(f"Cannot fetch the image {url[:80]}: this host offers no fetcher that refuses "
                               f"private addresses. Send the picture itself (a data: URL or an upload).") from None
    try:
        response = safe_get(url, timeout=FETCH_TIMEOUT_S)
        response.raise_for_status()
        data = response.content
    except Exception as error:  # network errors come in many types; the user needs the cause
        raise ImageDecodeError(f"Cannot fetch the image {url[:80]}: {type(error).__name__}: {error}") from error
    if len(data) > FETCH_MAX_BYTES:
        raise ImageDecodeError(f"The image {url[:80]} is larger than {FETCH_MAX_BYTES} bytes.")
    return data


def markers_to_tags(prompt: str, state: dict, to_tag: Callable[[Any, str], str]) -> tuple[str, int, List[str]]:
    """`prompt` with each `<__media__>` replaced by its picture's tag; how many markers had no picture;
    and why each unreadable picture of an earlier message was left out.

    `to_tag(picture, label)` turns bytes or a PIL image into a history tag. Markers and pictures
    are matched from the newest; markers left without a picture (more markers than pictures) are
    removed from the prompt.
    """
    count = prompt.count(MEDIA_MARKER)
    if count == 0:
        return prompt, 0, []
    every = state_images(state)
    pictures = every[-count:]
    missing = count - len(pictures)
    first_current = len(every) - current_pictures(state, every)
    tags, left_out = [""] * missing, []
    for i, picture in enumerate(pictures):
        label = f"picture {i + 1} of {len(pictures)}"
        try:
            tags.append(to_tag(picture_data(picture, label), label))
        except ImageDecodeError as error:
            if len(every) - len(pictures) + i >= first_current:
                raise
            tags.append("")
            left_out.append(str(error))
    pieces = prompt.split(MEDIA_MARKER)
    return "".join(piece + tag for piece, tag in zip(pieces, tags)) + pieces[-1], missing, left_out


def media_to_tags(prompt: str, state: dict, params: dict) -> str:
    """The prompt with its `<__media__>` markers replaced by the tags of the pictures `state` carries."""
    prompt, missing, left_out = markers_to_tags(
        prompt, state, lambda picture, label: history_tags([picture], state, params, lambda i, n: label)[0])
    if missing:
        notices.tell(state, f"{missing} {MEDIA_MARKER} marker(s) in the prompt had no picture in the request "
                            f"and were left out.")
    for cause in left_out:
        notices.tell(state, f"A picture of an earlier message was left out: {cause}")
    return prompt


def with_state_pictures(prompt: str, state: dict, params: dict) -> str:
    """The prompt as the extension reads it: its `<__media__>` markers as tags (`media_to_tags`). A prompt
    with neither markers nor tags, sent to `/v1/completions` with pictures (`state['raw_images']`: its
    messages' image parts), gets their tags before it, one a line, where text-generation-webui's own
    ExLlamaV3 loader puts them."""
    if MEDIA_MARKER in prompt:
        return media_to_tags(prompt, state, params)
    raw = list(state.get("raw_images") or [])
    if not raw or has_tag(prompt):
        return prompt
    label = lambda i, n: f"picture {i + 1} of {n}"  # noqa: E731
    return "".join(tag + "\n" for tag in history_tags(raw, state, params, label)) + prompt


_stand_in_tag: list[str] = []


def stand_in_tag() -> str:
    """The tag of a blank picture, standing in for a `<__media__>` marker when a prompt is only measured
    (text-generation-webui measures prompts without their state, so the real picture is not known)."""
    if not _stand_in_tag:
        _stand_in_tag.append(store_image(Image.new("RGB", (history_max_side(),) * 2, (127, 127, 127))).tag)
    return _stand_in_tag[0]
