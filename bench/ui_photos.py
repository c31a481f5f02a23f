"""The Gradio chat in Chromium with phone photos in its history, beside the same chat with small pictures.

`python server.py` (the demo model, greedy, 48-token replies) in Debian's Chromium: one browser session
sends four turns, each with a new photo-like JPEG, then two text-only turns; a second session does the
same with small pictures. Per turn it prints the seconds from Enter to the reply's end (the page's
reply unchanged for 1.5 s, not counted) and the bytes the page received (Chromium's network events).
The chat is rendered again at every streamed update: what it sends for a picture is what this measures.

    python bench/ui_photos.py

Prints a table and one JSON object; the ratio is the text turns' seconds with phone photos over small.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.photo_chat import print_turns  # noqa: E402
from bench.picture_once import machine, photo_jpeg  # noqa: E402
from fixtures.browser_helpers import chromium, open_chat, send, server_process, wait_for_reply  # noqa: E402

SIZES = {"small": (640, 480), "phone": (4032, 3024)}
PICTURE_TURNS, TEXT_TURNS = 4, 2
SETTLE_SECONDS = 1.5  # wait_for_reply's wait for the reply to stop changing


def one_chat(browser, url: str, folder: Path, size: tuple[int, int]) -> list[dict]:
    page = open_chat(browser, url)
    network = page.context.new_cdp_session(page)
    network.send("Network.enable")
    received = []
    network.on("Network.dataReceived", lambda event: received.append(event["dataLength"]))
    rows = []
    for index in range(PICTURE_TURNS + TEXT_TURNS):
        picture = index < PICTURE_TURNS
        if picture:
            path = folder / f"{size[0]}-{index}.jpg"
            path.write_bytes(photo_jpeg(size, 300 + index))
            page.set_input_files("#multimodal-images input[type=file]", [str(path)])
            page.wait_for_function("document.querySelectorAll('#multimodal-preview img').length === 1",
                                   timeout=120_000)
        received.clear()
        started = time.monotonic()
        send(page, f"What is in picture {index + 1}?" if picture else "And then?")
        wait_for_reply(page, index + 1, seconds=600)
        rows.append({"picture": picture, "seconds": round(time.monotonic() - started - SETTLE_SECONDS, 2),
                     "received_mb": round(sum(received) / 1e6, 2)})
    page.context.close()
    return rows


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    settings = folder / "settings.yaml"
    settings.write_text("max_new_tokens: 48\nban_eos_token: true\ndo_sample: false\n")
    with server_process(["--settings", str(settings)], folder / "server.log") as url, chromium() as browser:
        results = {name: one_chat(browser, url, folder, size) for name, size in SIZES.items()}
    text = print_turns(results, "s, MB received", "seconds", lambda row: f"{row['seconds']}, {row['received_mb']}")
    print(json.dumps({"text_turn_seconds": text, "phone_over_small": round(text["phone"] / text["small"], 2),
                      "jpeg_bytes": {name: len(photo_jpeg(size, 300)) for name, size in SIZES.items()},
                      "machine": machine(), "turns": results}))


if __name__ == "__main__":
    main()
