"""The OpenAI-compatible HTTP API (`--api`): `server.py` builds the app and runs uvicorn in a thread.

Layout: `config` (settings from the command line), `errors` (OpenAI's error shape), `schemas`
(request validation), `image_fetch` (data URLs and remote URLs with server-side request forgery
guards), `image_tags` (bytes -> `<img>` tag through the multimodal extension), `prompts` (messages
-> chat history), `generation` (running `generate_reply` off the event loop), `routes` (endpoints).
Importing this package starts nothing.
"""
