"""Building the API app and serving it with uvicorn in a background thread.

`start_in_background()` is what `server.py --api` calls: it binds 127.0.0.1:--api-port (every
interface, or --listen-host, with --listen) and returns once uvicorn listens. `create_app(config)`
builds the FastAPI app alone, for tests or another ASGI server.
"""
from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from modules import shared
from modules.api.config import APIConfig, bind_host, config_from_args
from modules.api.errors import install_handlers
from modules.api.routes import build_router
from modules.logging_colors import logger


def create_app(config: APIConfig | None = None) -> FastAPI:
    config = config if config is not None else config_from_args(shared.args)
    app = FastAPI(title="OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    # Any origin, as text-generation-webui's API: chat front-ends that run in the browser call it from
    # their page (a preflight first). `--api-key` is what guards it.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"],
                       allow_headers=["*"])
    app.include_router(build_router(config))
    return app


class BackgroundServer:
    """uvicorn serving `app` from a daemon thread; `stop()` shuts it down."""

    def __init__(self, app: FastAPI, host: str, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", log_config=None,
                                                    timeout_graceful_shutdown=2))
        self.host, self.port = host, port
        self.thread = threading.Thread(target=self._serve, daemon=True, name="api-server")

    def _serve(self) -> None:
        try:
            self.server.run()
        except SystemExit:  # uvicorn exits when it cannot bind; start() reports that to the caller
            pass

    def start(self, timeout_s: float = 15.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"The API server could not start on {self.host}:{self.port} "
                                   f"(is the port in use? pick another with --api-port)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"The API server did not start on {self.host}:{self.port} within {timeout_s:g} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_in_background(config: APIConfig | None = None, host: str | None = None,
                        port: int | None = None) -> BackgroundServer:
    args = shared.args
    host = host or bind_host(args)
    port = args.api_port if port is None else port
    config = config if config is not None else config_from_args(args)
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        logger.warning(f"The API listens on {host} without --api-key: anyone who can reach this port can use it")
    server = BackgroundServer(create_app(config), host, port).start()
    logger.info(f"OpenAI-compatible API: http://{host}:{port}/v1")
    return server
