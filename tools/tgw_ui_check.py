"""Today's text-generation-webui's own page, in Chromium, with the extension: families, then a refused picture.

    python tools/tgw_ui_check.py --harness HARNESS_DIR --model-dir MODELS --hf-home DIR --out OUT \
        --families qwen2_5_vl gemma3 ... --refusal qwen2_5_vl [--work DIR]

Run with a Python that has Playwright and Pillow (this repository's venv).
1. For each family: the harness's `ui_shim/ui_in_browser.py` (text-generation-webui 1dcde41d's page on
   stock gradio, Debian's Chromium): a picture attached in the chat box, two turns, the picture in the
   history, no error (OUT/<family>/turn1.png, turn2.png). Its settings file bans the tokens a random
   tiny model would otherwise say invisibly (the harness bans the same), so each reply shows text.
2. The refusal, on one family's page, as a user would: attach a PNG cut short (`broken.png`), ask, send:
   the page must show the extension's message ("Cannot read picture ...") and keep the user's message
   (OUT/refusal-<family>/refused.png); then attach a good picture and ask again: a reply must appear,
   the new picture shown in its message (after.png).
Exit 0 when every family's check and the refusal hold, with no page error, and every traceback in
the refusal's server log is the refusal's own.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = "Cannot read picture"
USER_TEXTS_JS = "() => [...document.querySelectorAll('#chat .user-message')].map(m => m.innerText.trim())"
PICTURES_JS = """(n) => { const m = document.querySelectorAll('#chat .user-message')[n];
  return m ? [...m.querySelectorAll('.image-attachment img')].filter(i => i.complete && i.naturalWidth > 0).length : 0; }"""
TOASTS_JS = "() => [...document.querySelectorAll('.toast-body')].map(t => t.innerText.trim())"


def broken_png(out: Path, picture) -> Path:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    path = out / "broken.png"
    path.write_bytes(buffer.getvalue()[:len(buffer.getvalue()) // 2])
    return path


def send(page, question: str, picture: Path) -> None:
    page.set_input_files("#chat-input input[type=file]", str(picture))
    page.wait_for_selector("#chat-input .thumbnail-item", timeout=60_000)
    page.fill("#chat-input textarea", question)
    page.click("#Generate")


def wait_for_toast(page) -> list[str]:
    for _ in range(240):  # up to 120 s
        toasts = page.evaluate(TOASTS_JS)
        if any(MESSAGE in toast for toast in toasts):
            return toasts
        page.wait_for_timeout(500)
    return page.evaluate(TOASTS_JS)


def wait_for_reply(page, ui, n: int) -> bool:
    for _ in range(600):  # up to 300 s
        if page.evaluate(ui.DONE_JS, n):
            return True
        page.wait_for_timeout(500)
    return False


def drive(url: str, broken: Path, good: Path, out: Path, ui) -> list[str]:
    from playwright.sync_api import sync_playwright

    problems, page_errors = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.on("pageerror", lambda error: page_errors.append(str(error)))
        page.goto(url)
        page.wait_for_selector("#chat-input textarea", timeout=120_000)
        page.wait_for_timeout(3000)
        send(page, "What is in this picture?", broken)
        toasts = wait_for_toast(page)
        page.evaluate(ui.SHOW_FIRST_JS)
        page.screenshot(path=str(out / "refused.png"))
        users = page.evaluate(USER_TEXTS_JS)
        print(f"refused: toasts {toasts}; user messages {users}; screenshot {out / 'refused.png'}", flush=True)
        if not any(MESSAGE in toast for toast in toasts):
            problems.append(f"no toast with {MESSAGE!r}: {toasts}")
        if not any("What is in this picture?" in text for text in users):
            problems.append(f"the refused message is gone from the chat: {users}")
        send(page, "And what about this one?", good)
        answered = wait_for_reply(page, ui, 2)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(out / "after.png"))
        state = page.evaluate(ui.STATE_JS)
        shown = page.evaluate(PICTURES_JS, state["users"] - 1)
        print(f"after: replies {state['replies']}; pictures in the last user message {shown}; "
              f"screenshot {out / 'after.png'}", flush=True)
        if not answered or not state["replies"] or not state["replies"][-1]:
            problems.append("the valid message after the refusal got no reply")
        if shown < 1:
            problems.append("the good picture is not shown in its message")
        browser.close()
    return problems + [f"page error: {error}" for error in page_errors]


def foreign_tracebacks(log: str) -> int:
    """Tracebacks in the server log that do not end in the refusal (a chained exception's earlier
    tracebacks end in "The above exception was the direct cause of the following exception")."""
    blocks = log.split("Traceback (most recent call last):")[1:]
    last_of_chain = [block for block in blocks if "The above exception was" not in block and "During handling" not in block]
    return sum(1 for block in last_of_chain if "PictureRefused" not in block)


def token_bans(folder: Path) -> str:
    """Token ids a random tiny model must not say for its reply to show: those that decode to a lone
    UTF-8 byte (text-generation-webui's streamer withholds text holding U+FFFD), its BOS and unknown
    token (the harness's run_in_tgw.py bans the same through the same field)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    bans = {i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])}
    bans |= {i for i in (tokenizer.unk_token_id, tokenizer.bos_token_id) if i is not None}
    return ",".join(str(i) for i in sorted(bans))


def settings_file(folder: Path, out: Path) -> Path:
    """Settings for a page whose replies must show: 40 new tokens, EOS and invisible tokens banned."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "settings.yaml"
    path.write_text(f"max_new_tokens: 40\nauto_max_new_tokens: false\nban_eos_token: true\n"
                    f"custom_token_bans: '{token_bans(folder)}'\n")
    return path


def check_family(args, family: str) -> bool:
    """The harness's own browser check of one family's page; its verdict line."""
    out = args.out / family
    command = [sys.executable, str(args.harness / "ui_shim" / "ui_in_browser.py"), "--extension-dir",
               str(ROOT / "extensions" / "multimodal"), "--model-dir", str(args.model_dir), "--model", family,
               "--out", str(out), "--work", str(args.work / f"ui-{family}"), "--hf-home", args.hf_home,
               "--max-new-tokens", "0", "--", "--settings", str(settings_file(args.model_dir / family, out))]
    result = subprocess.run(command, capture_output=True, text=True)
    (out / "check.log").write_text(result.stdout + result.stderr)
    verdict = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{'PASS' if result.returncode == 0 else 'FAIL'} {family}: {verdict} [screenshots: {out}]", flush=True)
    return result.returncode == 0


def check_refusal(args, family: str) -> bool:
    sys.path[:0] = [str(args.harness), str(args.harness / "ui_shim")]
    import ui_in_browser as ui
    from run_in_tgw import build_overlay, make_picture, unpack_tarball

    root, out = ROOT, args.out / f"refusal-{family}"
    out.mkdir(parents=True, exist_ok=True)
    good = out / "picture.png"
    make_picture().save(good)
    broken = broken_png(out, make_picture())
    tree = unpack_tarball(args.harness / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
    tgw = build_overlay(tree, root / "extensions" / "multimodal", args.work / f"ui-refusal-{family}", [])
    settings_file(args.model_dir / family, tgw / "user_data")
    port, log = ui.free_port(), out / "server.log"
    server = ui.start_server(Namespace(hf_home=args.hf_home, tgw_python=args.tgw_python, model=family,
                                       model_dir=args.model_dir, extra=[]), tgw, port, log)
    try:
        if not ui.wait_for_server(f"http://127.0.0.1:{port}/", server):
            print(f"FAIL refusal: the UI server did not come up (log: {log})")
            return False
        problems = drive(f"http://127.0.0.1:{port}/", broken, good, out, ui)
    finally:
        ui.stop_server(server)
    foreign = foreign_tracebacks(log.read_text(errors="replace"))
    problems += [f"{foreign} traceback(s) in the server log besides the refusal's ({log})"] * (foreign > 0)
    print("\n".join(f"FAIL refusal: {problem}" for problem in problems) or
          f"PASS refusal ({family}): the message on the page, the user's message kept, the next picture "
          f"answered [screenshots: {out}]")
    return not problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", required=True, type=Path)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--hf-home", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--families", nargs="*", default=[])
    parser.add_argument("--refusal", default=None, help="the family whose page gets the refused picture")
    parser.add_argument("--tgw-python", default="/tmp/tgw_venv_head/bin/python")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tgw_ui_work"), help="the overlays of its tree")
    args = parser.parse_args()
    results = [check_family(args, family) for family in args.families]
    if args.refusal:
        results.append(check_refusal(args, args.refusal))
    print(f"{results.count(True)} passed, {results.count(False)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
