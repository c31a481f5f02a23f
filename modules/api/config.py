"""The API's settings as one value, built from the command line or by a test.

Tests build an `APIConfig` directly, e.g. with small byte caps or an `address_allowed` that lets
exactly one local test server through while every other private address stays refused.
"""
from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field
from typing import Callable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MB = 1024 * 1024


def is_public_address(ip: IPAddress, port: int) -> bool:
    """Whether fetching from `ip` cannot reach this machine or its private network."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def allow_any_address(ip: IPAddress, port: int) -> bool:
    return True


@dataclass
class APIConfig:
    api_key: str = ""
    # (resolved address, port) -> may we connect? Checked for every redirect hop too.
    address_allowed: Callable[[IPAddress, int], bool] = field(default=is_public_address)
    max_body_bytes: int = 20 * MB  # a request body above this gets 413
    max_image_bytes: int = 20 * MB  # one decoded data URL or fetched image above this gets 413
    fetch_timeout_s: float = 10.0  # the whole fetch of one remote image, redirects included
    max_redirects: int = 5
    max_images_per_request: int = 32  # bounds the concurrent fetches and decodes one request can start


def config_from_args(args: argparse.Namespace) -> APIConfig:
    allowed = allow_any_address if args.api_allow_private_urls else is_public_address
    return APIConfig(api_key=args.api_key or "", address_allowed=allowed)


def bind_host(args: argparse.Namespace) -> str:
    """127.0.0.1 unless --listen (then --listen-host, or every interface)."""
    if not args.listen:
        return "127.0.0.1"
    return args.listen_host or "0.0.0.0"
