"""The bad-picture corpus (fixtures/bad_pictures.py) through today's text-generation-webui's real server.

    python tools/tgw_bad_pictures.py HARNESS_WORK_DIR FAMILIES_DIR FAMILY

Run with text-generation-webui's Python (the harness's `/tmp/tgw_venv_head`). It starts
`extensions/multimodal/launch.py --model FAMILY --extensions multimodal --nowebui --api` in an overlay
of its source (nothing is edited), then through its OpenAI API (`/v1/chat/completions`):
1. each bad picture of the corpus, as a whole (non-streamed) request: HTTP 400, text-generation-webui's
   own error body (`{"error": {"message", "type": "invalid_request_error", ...}}`) with a message
   naming the cause; and after each, a valid request with a good picture is answered (HTTP 200);
2. one bad picture as a streamed request: text-generation-webui sends its 200 and the first chunk
   before any extension hook runs, so the refusal can only end the stream; the server must go on
   serving, and the message must reach its log;
3. the server log holds no traceback of the extension's but the refusals'.
Exit 0 when all hold.
"""
from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fixtures import bad_pictures  # noqa: E402
from tools.tgw_server_check import data_url, free_port, start, wait_for  # noqa: E402


def request(api: str, body: dict, timeout: float = 300) -> tuple[int, str]:
    """(status, body text) of a POST to /v1/chat/completions."""
    message = urllib.request.Request(f"{api}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(message, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, http.client.IncompleteRead) as error:  # a stream cut off
        return -1, f"{type(error).__name__}: {error}"


def good_request(picture_url: str) -> dict:
    return {**bad_pictures.request_body(bad_pictures.BadPicture("good", picture_url, ())),
            "max_tokens": 4, "ban_eos_token": True}


def check_case(api: str, case: bad_pictures.BadPicture, good: dict) -> bool:
    status, text = request(api, bad_pictures.request_body(case))
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        error = {}
    refused = (status == 400 and error.get("type") == "invalid_request_error"
               and bad_pictures.names_the_cause(str(error.get("message")), case))
    after, _ = request(api, good)
    ok = refused and after == 200
    print(f"{'PASS' if ok else 'FAIL'} {case.name}: HTTP {status} {str(error.get('message') or text)[:160]!r}; "
          f"the next valid request: HTTP {after}")
    return ok


def check_stream(api: str, case: bad_pictures.BadPicture, good: dict, log: Path) -> bool:
    status, text = request(api, {**bad_pictures.request_body(case), "stream": True})
    after, _ = request(api, good)
    logged = "Cannot read" in log.read_text(errors="replace")
    ok = after == 200 and logged
    print(f"{'PASS' if ok else 'FAIL'} streamed {case.name}: HTTP {status} then the stream ends ({text[-120:]!r}); "
          f"the message in the server log: {logged}; the next valid request: HTTP {after}")
    return ok


def main() -> int:
    work, families, family = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, str(work))
    from run_in_tgw import build_overlay, make_picture, unpack_tarball

    tree = unpack_tarball(work / "tgw-1dcde41d.tar.gz", Path("/tmp/tgw_trees"))
    tgw = build_overlay(tree, ROOT / "extensions" / "multimodal", work / "runs" / "bad-pictures", [])
    port, log = free_port(), work / "bad-pictures-server.log"
    process = start(tgw, families, family, port, log)
    api, good = f"http://127.0.0.1:{port}", good_request(data_url(make_picture()))
    cases = bad_pictures.cases()
    try:
        wait_for(f"{api}/v1/models", process)
        results = [check_case(api, case, good) for case in cases]
        results.append(check_stream(api, cases[0], good, log))
    finally:
        process.terminate()
        process.wait(30)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed (server log: {log})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
