"""Start the chat host: parse the command line, load settings, the model and extensions, then serve.

    python server.py                      # the shipped demo model, UI on http://127.0.0.1:7860
    python server.py --model NAME --api   # a model under models/, plus the OpenAI-compatible API

As a library, `main(argv, logits_processors=[MyProcessor, "module.path:Class"])` also loads those
logits processors (README.md, "Logits processors").
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence, Union

from modules import shared
from modules.logging_colors import logger


def load_model_and_extensions() -> None:
    import modules.extensions
    import modules.models

    name = shared.args.model or shared.settings.get("model")
    if name and not shared.args.model:
        try:
            modules.models.resolve_model_path(name)
        except FileNotFoundError as error:
            logger.warning(f"The settings' model is not available: {error}")
            name = None
    if name:
        shared.model, shared.tokenizer = modules.models.load_model(name)
        shared.model_name = Path(name).name  # the folder's name, as text-generation-webui shows it
        if shared.is_multimodal and "multimodal" not in shared.args.extensions:
            logger.info("Image-text model: enabling the multimodal extension")
            shared.args.extensions.append("multimodal")
    else:
        logger.warning("No model given: starting without one. Put a model folder under models/ "
                       "(see models/README.md) and start with --model NAME.")
    modules.extensions.load_extensions()


def launch_ui(block: bool) -> None:
    from modules import ui_chat

    interface = ui_chat.create_interface()
    host = shared.args.listen_host or ("0.0.0.0" if shared.args.listen else "127.0.0.1")
    interface.queue(default_concurrency_limit=4)
    interface.launch(server_name=host, server_port=shared.args.listen_port, prevent_thread_lock=not block,
                     css=ui_chat.interface_css(), js=ui_chat.interface_js(), show_error=True, quiet=False,
                     footer_links=[])


def main(argv: list[str], logits_processors: Sequence[Union[str, type]] = ()) -> None:
    shared.args = shared.parse_args(argv)
    from modules import logits_processor_loader  # after parsing: --help needs no torch

    used = shared.load_settings(shared.args.settings)
    if used is not None:
        logger.info(f"Loaded settings from {used}")
    # Resolved before the model loads, so a wrong class path fails at once.
    processor_classes = logits_processor_loader.requested_classes(shared.args.logits_processors, logits_processors)
    load_model_and_extensions()
    shared.logits_processors = logits_processor_loader.build_runner(processor_classes)
    if shared.args.api:
        from modules.api import server as api_server

        api_server.start_in_background()
    if shared.args.nowebui:
        if not shared.args.api:
            logger.warning("--nowebui without --api: nothing to serve")
            return
        while True:
            time.sleep(3600)
    launch_ui(block=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        logger.info("Stopped.")
    except ValueError as error:
        from modules.logits_processor_loader import LogitsProcessorLoadError  # already imported by main()

        if not isinstance(error, LogitsProcessorLoadError):
            raise
        logger.error(f"Cannot start: {error}")  # a start-up mistake: the message says the fix, no traceback
        sys.exit(2)
