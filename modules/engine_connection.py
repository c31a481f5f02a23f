"""Start-up with a remote engine (`--engine-url`): wait for it, find the served model, check it takes our prompts.

An engine started beside the host (a compose file, a script) may still be loading its model: the host
waits for it up to `--engine-timeout`, saying so once, and then gives up with the engine's own answer.
"""
from __future__ import annotations

import time
from typing import Optional

from modules.engine import EngineUnreachableError, RemoteEngine, ServedModel
from modules.logging_colors import logger

POLL_SECONDS = 2.0


def connect(url: str, api_key: str, timeout: float, model: Optional[str]) -> tuple[RemoteEngine, ServedModel]:
    from modules.openai_engine import OpenAIChatEngine

    engine = OpenAIChatEngine(url, api_key=api_key, timeout=timeout)
    served = wait_for_model(engine, model, timeout)
    engine.check()
    return engine, served


def wait_for_model(engine: RemoteEngine, model: Optional[str], timeout: float) -> ServedModel:
    deadline = time.monotonic() + timeout
    told = False
    while True:
        try:
            return engine.served_model(model)
        except EngineUnreachableError:
            if time.monotonic() > deadline:
                raise
            if not told:
                logger.info(f"Waiting up to {timeout:g} s for the {engine.description} to answer...")
                told = True
            time.sleep(POLL_SECONDS)
