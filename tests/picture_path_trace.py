"""Runs one picture turn through the UI's chat function and one through `/v1/chat/completions` on the
shipped demo model, and prints, as JSON, the repository files whose functions ran in each (every
thread traced). Run in a fresh process (`tests/test_picture_path.py` does): threads that exist
before the trace starts would not be traced.
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SOURCES = tuple(str(ROOT / folder) + "/" for folder in ("modules", "extensions")) + (str(ROOT / "server.py"),)
ran: set[str] = set()
recording = threading.Event()


def profiler(frame, event, arg):
    if event == "call" and recording.is_set() and frame.f_code.co_name != "<module>":
        name = frame.f_code.co_filename
        if name.startswith(SOURCES):
            ran.add(str(Path(name).relative_to(ROOT)))


def recorded(turn) -> list[str]:
    """The files `turn(colour)` runs, with a picture no earlier turn sent (its rows are not cached)."""
    turn("red")  # the first turn loads what later turns reuse (the processor, the compute thread)
    ran.clear()
    recording.set()
    try:
        turn("blue")
    finally:
        recording.clear()
    return sorted(ran)


def main() -> None:
    threading.setprofile(profiler)
    sys.setprofile(profiler)
    from modules import chat, shared, ui_chat
    from fixtures import api_helpers, host_helpers

    host_helpers.load(ROOT / "models" / "tiny-llava-shapes", ["multimodal"], settings={"max_new_tokens": 4})
    ui_chat.create_interface()  # the extension's UI registers its per-message image input
    folder = Path(sys.argv[1])
    values = [4, 0.0, 1.0, shared.settings["truncation_length"]]

    def ui_turn(colour: str):
        picture = folder / f"{colour}.png"
        picture.write_bytes(api_helpers.image_bytes(colour, "square"))
        list(ui_chat.generate("What is in the picture?", chat.new_history(), *values, [str(picture)]))

    api = api_helpers.start_api()

    def api_turn(colour: str):
        url = api_helpers.data_url(api_helpers.image_bytes(colour, "circle"))
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is in it?"}]
        api.client().chat.completions.create(model="local", max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": content}])

    try:
        print(json.dumps({"upload": recorded(ui_turn), "api": recorded(api_turn)}))
    finally:
        api.stop()


if __name__ == "__main__":
    main()
