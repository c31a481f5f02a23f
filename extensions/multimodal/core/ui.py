"""The multimodal extension's Gradio UI: an image input under the chat, and the embed-all checkbox.

`create_ui(params, hijack_picture, embeds_all)` is called by the extension's `ui()` hook inside the host's
Gradio context. Two forms, chosen by what the host offers:
- hosts with per-message extension inputs (this repository's: `shared.gradio['extension_inputs']`):
  a multi-file image input (upload, drag-and-drop, or paste anywhere on the page) and a preview of
  the pending images in order. It is registered as `extension_inputs['message_images']`: the
  host reads it when a message is sent, clears it in the same step, and passes the value on as
  `state['message_images']` = a list of image file paths in upload order (None when empty).
  Pending images live in the browser session's component value, so sessions never share them.
  Beside it, where the host also has per-message extension options (`extension_options`), a picture
  budget choice ("default", "low", "high": image_budget.py), registered as
  `extension_options['image_budget']`: the host reads it with every message as
  `state['image_budget']` and keeps it (it is no message content, and stays until changed).
- text-generation-webui (no such registry): the original extension's single picture, a
  `gr.Image` whose upload calls `hijack_picture(picture)` (the extension's `input_hijack` then
  puts it into the next message), cleared when the message is sent.
Both add a checkbox bound to `params['add_all_images_to_prompt']`. Gradio 4 (text-generation-webui)
and 6 (this repository) both build them.
This module knows nothing about tensors, pipelines or image tags.
"""
from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from extensions.multimodal.core.defaults import IMAGE_BUDGET, MESSAGE_IMAGES
from modules import shared

STATE_KEY = MESSAGE_IMAGES  # the host hands the value to extensions as state["message_images"]
EMBED_ALL_LABEL = "Embed all images, not only the last one"
BUDGET_LABEL = "Picture budget for each message"
BUDGET_LEVELS = ["default", "low", "high"]
BUDGET_INFO = "default: the model's own settings; low: at most 512x512 pixels (fewer tokens); high: up to 2048x2048"

# Paste support: Gradio's file input takes uploads and drops, not clipboard pastes. A paste that
# carries image files (outside the file input itself) is handed to the file input's <input
# type=file>, which then uploads them like a selection from the file dialog.
PASTE_JS = """
const input = () => document.querySelector('#multimodal-images input[type=file]');
document.addEventListener('paste', (event) => {
  const files = Array.from(event.clipboardData ? event.clipboardData.files : [])
    .filter((f) => f.type.startsWith('image/'));
  const target = input();
  if (files.length === 0 || !target) return;
  event.preventDefault();
  const transfer = new DataTransfer();
  files.forEach((f) => transfer.items.add(f));
  target.files = transfer.files;
  target.dispatchEvent(new Event('change', { bubbles: true }));
});
"""


def preview(paths: list[str] | None):
    """The pending images for the preview gallery, hidden when there are none."""
    return gr.update(value=list(paths or []), visible=bool(paths))


def create_ui(params: dict, hijack_picture: Callable[[Any], None], embeds_all: Callable[[], bool]) -> None:
    """Builds the image input under the chat: per-message extension input where the host has them.
    `embeds_all()` says whether every image is embedded now (the checkbox's value)."""
    if "extension_inputs" in shared.gradio:
        create_multi_image_ui(params, embeds_all)
    else:
        create_single_picture_ui(params, hijack_picture, embeds_all)


def embed_all_checkbox(params: dict, embeds_all: Callable[[], bool]) -> gr.Checkbox:
    # A callable value is read on each page load, so a new session shows the current setting.
    checkbox = gr.Checkbox(value=embeds_all, label=EMBED_ALL_LABEL, elem_id="multimodal-embed-all")
    checkbox.change(lambda value: params.update(add_all_images_to_prompt=bool(value)), checkbox, None,
                    queue=False, show_progress="hidden")
    return checkbox


def budget_choices(setting: Any) -> list[tuple[str, str]]:
    """The radio's (label, value) choices: the three levels, and the `image_budget` setting when it is a
    pixel count (so the radio can start at the setting the server was given)."""
    choices = [(level, level) for level in BUDGET_LEVELS]
    if setting not in (None, "", *BUDGET_LEVELS):
        choices.append((f"{setting} pixels (the setting)", str(setting)))
    return choices


def budget_radio(params: dict) -> gr.Radio:
    setting = params.get("image_budget")
    start = "default" if setting in (None, "") else str(setting)
    return gr.Radio(budget_choices(setting), value=start, label=BUDGET_LABEL, info=BUDGET_INFO,
                    elem_id="multimodal-budget")


def create_multi_image_ui(params: dict, embeds_all: Callable[[], bool]) -> None:
    with gr.Column(elem_id="multimodal"):
        images = gr.File(label="Images for the next message (upload, drop, or paste)", file_count="multiple",
                         file_types=["image"], type="filepath", height=160, elem_id="multimodal-images")
        pending = gr.Gallery(label="Pending images, in order", interactive=False, visible=False, columns=8,
                             fit_columns=False, height=120, object_fit="contain", allow_preview=False,
                             elem_id="multimodal-preview")
        if "extension_options" in shared.gradio:
            budget = budget_radio(params)
            shared.gradio["extension_options"][IMAGE_BUDGET] = budget
            shared.gradio["multimodal_budget"] = budget
        embed_all = embed_all_checkbox(params, embeds_all)
        gr.HTML("", js_on_load=PASTE_JS, padding=False, elem_id="multimodal-paste")
    images.change(preview, images, pending, queue=False, show_progress="hidden")
    shared.gradio["extension_inputs"][STATE_KEY] = images
    shared.gradio[STATE_KEY] = images
    shared.gradio["multimodal_embed_all"] = embed_all


def create_single_picture_ui(params: dict, hijack_picture: Callable[[Any], None],
                             embeds_all: Callable[[], bool]) -> None:
    """The original extension's UI: one picture for the next message (text-generation-webui)."""
    with gr.Column(elem_id="multimodal"):
        picture = gr.Image(label="Send a picture", type="pil", elem_id="multimodal-picture")
        embed_all_checkbox(params, embeds_all)
    picture.upload(hijack_picture, [picture], None)
    picture.clear(lambda: hijack_picture(None), None, None)
    for name, event in (("Generate", "click"), ("textbox", "submit")):
        if name in shared.gradio:  # the picture goes with the message: clear it once sent
            getattr(shared.gradio[name], event)(lambda: None, None, picture)
    shared.gradio["multimodal_picture"] = picture
