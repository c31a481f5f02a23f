"""The multimodal extension's Gradio UI: an image input under the chat, and the embed-all checkbox.

`create_ui(params)` is called by the extension's `ui()` hook inside the host's Gradio context. It
adds a multi-file image input (upload, drag-and-drop, or paste anywhere on the page), a preview of
the pending images in order, and a checkbox bound to `params['add_all_images_to_prompt']`.

It registers the input as `shared.gradio['extension_inputs']['multimodal_images']`: the host reads
it when a message is sent, clears it in the same step, and passes the value on as
`state['multimodal_images']` = a list of image file paths in upload order (None when empty). The
extension's `chat_input_modifier` turns those into image tags. Pending images live in the browser
session's component value, so two sessions never see each other's images.
This module knows nothing about tensors, pipelines or image tags.
"""
from __future__ import annotations

import gradio as gr

from modules import shared

STATE_KEY = "multimodal_images"
EMBED_ALL_LABEL = "Embed all images, not only the last one"

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


def create_ui(params: dict) -> None:
    """Builds the image input under the chat and registers it as a per-message extension input."""
    with gr.Column(elem_id="multimodal"):
        images = gr.File(label="Images for the next message (upload, drop, or paste)", file_count="multiple",
                         file_types=["image"], type="filepath", height=160, elem_id="multimodal-images")
        pending = gr.Gallery(label="Pending images, in order", interactive=False, visible=False, columns=8,
                             fit_columns=False, height=120, object_fit="contain", allow_preview=False,
                             elem_id="multimodal-preview")
        # A callable value is read on each page load, so a new session shows the current setting.
        embed_all = gr.Checkbox(value=lambda: bool(params["add_all_images_to_prompt"]), label=EMBED_ALL_LABEL,
                                elem_id="multimodal-embed-all")
        gr.HTML("", js_on_load=PASTE_JS, padding=False, elem_id="multimodal-paste")
    images.change(preview, images, pending, queue=False, show_progress="hidden")
    embed_all.change(lambda value: params.update(add_all_images_to_prompt=bool(value)), embed_all, None,
                     queue=False, show_progress="hidden")
    shared.gradio.setdefault("extension_inputs", {})[STATE_KEY] = images
    shared.gradio[STATE_KEY] = images
    shared.gradio["multimodal_embed_all"] = embed_all
