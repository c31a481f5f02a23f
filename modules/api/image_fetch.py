"""Image URLs -> bytes: data URLs, and http(s) URLs fetched with server-side request forgery guards.

`fetch_guarded` is the host's one fetcher of remote URLs: the API awaits it here for `image_url`
parts, and `modules.web_search.safe_get` runs it synchronously for extensions. It resolves the host
name, refuses the request unless `config.address_allowed` accepts every resolved address, then
connects to the checked address itself (so a second DNS answer cannot swap in 127.0.0.1). Redirects
are followed by hand, each hop checked the same way. The whole fetch has one deadline and the body
one byte cap. `trust_env=False` keeps proxy variables from routing around the address check.
This module does not decode images.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

import anyio
import httpx

from modules.api.capped_read import TooLarge, read_capped
from modules.api.config import APIConfig, IPAddress
from modules.api.errors import APIError
from modules.message_memo import MessageMemo

PRIVATE_HINT = "start the server with --api-allow-private-urls to allow private addresses"
# Data URLs decoded lately, by the URL itself. An OpenAI-style client sends every picture of the
# conversation again with each request: finding a phone photo's URL here takes ~4 ms (hashing it),
# decoding its base64 again ~25. Bounded by the URLs' characters (their bytes take 3/4 as much again):
# more than the 20 MiB a request may carry, so a whole conversation's pictures stay.
DECODED = MessageMemo(max_chars=32 * 2**20)


async def fetch_image_bytes(url: str, config: APIConfig) -> bytes:
    """The bytes behind a `data:` or `http(s)://` URL. Raises APIError (400 or 413)."""
    if not isinstance(url, str) or not url:
        raise APIError(400, "An image_url must be a non-empty string (a data URL or an http(s) URL)")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return decode_data_url(url, config.max_image_bytes)
    if scheme not in ("http", "https"):
        raise APIError(400, f"Unsupported image URL scheme {scheme or '(none)'!r} in {shorten(url)}: "
                            f"send a data URL (data:image/png;base64,...) or an http(s) URL")
    fetched = await fetch_guarded(url, config, {"Accept": "image/*"})
    fetched.raise_for_status()
    return fetched.content


@dataclass(frozen=True)
class Fetched:
    """The answer at the end of the redirects; what callers of a `requests.Response` use of one."""
    url: str  # the last hop's URL
    status_code: int
    content: bytes  # the body, at most `config.max_image_bytes`

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def raise_for_status(self) -> None:
        if not 200 <= self.status_code < 300:
            raise APIError(400, f"Fetching {shorten(self.url)} answered HTTP {self.status_code}")


async def fetch_guarded(url: str, config: APIConfig, headers: dict[str, str] | None = None) -> Fetched:
    """GET an http(s) URL under the guards above, sending `headers` to every hop. Any final status
    comes back (the caller decides); a refused address or scheme, a network error, too many
    redirects, the deadline or the byte cap raise APIError (400, 413)."""
    try:
        with anyio.fail_after(config.fetch_timeout_s):
            return await fetch_remote(url, config, httpx.Headers(headers))
    except TimeoutError:
        raise APIError(400, f"Fetching {shorten(url)} took longer than {config.fetch_timeout_s:g} s") from None


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """`data:[<media type>][;base64],<payload>`; the decoded size is checked before decoding. A URL
    decoded lately under the same cap is not decoded again (`DECODED`)."""
    data = DECODED.get((url, max_bytes))
    if data is None:
        data = data_url_bytes(url, max_bytes)
        DECODED.put((url, max_bytes), data)
    return data


def data_url_bytes(url: str, max_bytes: int) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise APIError(400, f"Malformed data URL {shorten(url)}: no ',' between the header and the data")
    media_type = header[len("data:"):].split(";", 1)[0].strip().lower()
    if media_type and not (media_type.startswith("image/") or media_type == "application/octet-stream"):
        raise APIError(400, f"The data URL holds {media_type!r}, not an image")
    if not header.lower().endswith(";base64"):
        data = unquote_to_bytes(payload)
    else:
        payload = "".join(payload.split())  # some clients wrap base64 lines
        if len(payload) // 4 * 3 > max_bytes:
            raise too_large(f"The data URL image (about {len(payload) // 4 * 3} bytes)", max_bytes)
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as error:
            raise APIError(400, f"The data URL's base64 payload cannot be decoded: {error}") from None
    if len(data) > max_bytes:
        raise too_large(f"The data URL image ({len(data)} bytes)", max_bytes)
    if not data:
        raise APIError(400, "The data URL holds no data")
    return data


@dataclass
class Target:
    """Where one hop connects: the checked address, with the original name for Host and TLS."""
    url: httpx.URL  # the original URL with its host replaced by the checked address
    host: str
    host_header: str


async def fetch_remote(url: str, config: APIConfig, headers: httpx.Headers) -> Fetched:
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                 timeout=httpx.Timeout(config.fetch_timeout_s)) as client:
        for _ in range(config.max_redirects + 1):
            target = await checked_target(url, config)
            headers["Host"] = target.host_header  # replaces a caller's Host, whatever its case
            request = client.build_request("GET", target.url, headers=headers,
                                           extensions={"sni_hostname": target.host})
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as error:
                raise APIError(400, f"Cannot fetch {shorten(url)}: {type(error).__name__}: {error}") from None
            try:
                if response.is_redirect:
                    url = str(httpx.URL(url).join(response.headers["location"]))
                    continue
                return Fetched(url, response.status_code, await read_image_body(response, config.max_image_bytes, url))
            finally:
                await response.aclose()
    raise APIError(400, f"The URL redirected more than {config.max_redirects} times")


async def checked_target(url: str, config: APIConfig) -> Target:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise APIError(400, f"Invalid URL {shorten(url)}: {error}") from None
    if parsed.scheme not in ("http", "https"):
        raise APIError(400, f"Refused {shorten(url)}: the unsupported scheme {parsed.scheme!r} "
                            f"(only http and https are fetched)")
    if not parsed.host:
        raise APIError(400, f"The URL {shorten(url)} names no host")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if not 0 < port < 2**16:
        raise APIError(400, f"The URL {shorten(url)} names the port {port}, outside 1-65535")
    addresses = await resolve(parsed.host, port)
    refused = [ip for ip in addresses if not config.address_allowed(ip, port)]
    if refused:
        raise APIError(400, f"Refused to fetch {shorten(url)}: {parsed.host} resolves to {refused[0]}, a loopback, "
                            f"private, link-local or reserved address (server-side request forgery guard); "
                            f"{PRIVATE_HINT}", code="url_not_allowed")
    netloc = parsed.netloc.decode("ascii")
    return Target(url=parsed.copy_with(host=str(addresses[0])), host=parsed.host, host_header=netloc)


async def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise APIError(400, f"Cannot resolve the host {host!r}: {error}") from None
    # ip_address() refuses the scope suffix of a link-local IPv6 answer ("fe80::1%eth0").
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos))


async def read_image_body(response: httpx.Response, max_bytes: int, url: str) -> bytes:
    """The fetched body, at most `max_bytes`; a larger one is a 413 (the connection is closed, not drained)."""
    try:
        return await read_capped(response.aiter_bytes(), response.headers.get("content-length"), max_bytes)
    except TooLarge as error:
        size = f"{error.size} bytes" if error.declared else f"more than {max_bytes} bytes"
        raise too_large(f"The body of {shorten(url)} ({size})", max_bytes) from None
    except httpx.HTTPError as error:  # cut short, or a body its Content-Encoding does not decode
        raise APIError(400, f"Cannot fetch {shorten(url)}: its body could not be read: "
                            f"{type(error).__name__}: {error}") from None


def too_large(what: str, max_bytes: int) -> APIError:
    return APIError(413, f"{what} is larger than the {max_bytes}-byte limit for one image", code="image_too_large")


def shorten(url: str, keep: int = 80) -> str:
    return url if len(url) <= keep else f"{url[:keep]}..."
