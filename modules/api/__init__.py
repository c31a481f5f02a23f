"""The OpenAI-compatible HTTP API (`--api`): `server.py` builds the app and runs uvicorn in a thread.

Layout: `config` (settings from the command line), `errors` (OpenAI's error shape), `schemas`
(request validation), `capped_read` (a request or image body read under a byte cap), `image_fetch`
(data URLs and remote URLs -> bytes, with server-side request forgery guards), `messages` (messages ->
earlier turns and the new user message, pictures as bytes), `generation` (a request's state and the
chat turn of `modules.chat`, run off the event loop), `responses` (OpenAI's response shapes), `routes`
(endpoints). Importing this package starts nothing.
"""
