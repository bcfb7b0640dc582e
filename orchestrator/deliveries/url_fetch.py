"""Fetching an http(s) URL on the host for `send_file` / `send_image`: size cap,
one overall timeout, and never a private-range address.

The host name is resolved first and every address it resolves to is checked; the request then
goes to the checked address itself (Host header and TLS SNI keep the name), so a DNS answer
cannot change between the check and the connection. Each redirect hop is checked the same way.
Loopback is refused too, unless explicitly allowed (the tests fetch from their own server).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

import httpx

from orchestrator.errors import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

MAX_REDIRECTS = 5
_REDIRECTS = {301, 302, 303, 307, 308}
_FILENAME = re.compile(r"""filename\*?=(?:UTF-8'')?["']?([^"';]+)""", re.IGNORECASE)


def address_refusal(ip: IPAddress, *, allow_loopback: bool) -> str | None:
    """Why the host must not connect to `ip` (None: it may). Pure."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    if ip.is_loopback:
        return None if allow_loopback else "a loopback address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified:
        return "the unspecified address"
    if not ip.is_global:
        return "a private or reserved address"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Fetched:
    data: bytes
    media_type: str | None  # from Content-Type, without parameters
    file_name: str | None  # from Content-Disposition or the URL's last segment
    url: str  # the final URL after redirects


def file_name_from(url: httpx.URL, content_disposition: str | None) -> str | None:
    if content_disposition:
        match = _FILENAME.search(content_disposition)
        if match:
            return unquote(match.group(1)).strip().rsplit("/", 1)[-1] or None
    last = unquote(url.path.rsplit("/", 1)[-1]) if url.path else ""
    return last or None


class UrlFetcher:
    def __init__(
        self,
        *,
        timeout_s: float,
        allow_loopback: bool = False,
        resolver: Resolver = system_resolver,
        max_redirects: int = MAX_REDIRECTS,
    ) -> None:
        self.timeout_s = timeout_s
        self.allow_loopback = allow_loopback
        self._resolve = resolver
        self._max_redirects = max_redirects

    def checked_address(self, url: httpx.URL) -> str:
        """The address to connect to for `url`, after checking all its host resolves to."""
        host = url.host
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            candidates = [str(literal)]
        else:
            try:
                candidates = self._resolve(host, url.port or (443 if url.scheme == "https" else 80))
            except (OSError, UnicodeError) as exc:
                raise ToolError("url_fetch_failed", f"The host {host} could not be resolved ({exc}): {url}") from None
        if not candidates:
            raise ToolError("url_fetch_failed", f"The host {host} has no address: {url}")
        for candidate in candidates:
            reason = address_refusal(ipaddress.ip_address(candidate.split("%", 1)[0]), allow_loopback=self.allow_loopback)
            if reason is not None:
                raise ToolError(
                    "url_refused",
                    f"This URL is not fetched: its host {host} resolves to {reason} ({candidate}); only "
                    f"public http(s) addresses are allowed: {url}",
                    url=str(url),
                )
        return candidates[0]

    def fetch(self, raw_url: str, *, max_bytes: int) -> Fetched:
        try:
            url = httpx.URL(raw_url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise ToolError("invalid_arguments", f"Not a valid URL ({exc}): {raw_url}", field="path_or_url") from None
        deadline = time.monotonic() + self.timeout_s
        with httpx.Client(trust_env=False, follow_redirects=False, timeout=self.timeout_s) as client:
            for _ in range(self._max_redirects + 1):
                if url.scheme not in ("http", "https") or not url.host:
                    raise ToolError("invalid_arguments", f"Only http(s) URLs can be fetched: {url}", field="path_or_url")
                if url.userinfo:
                    raise ToolError("url_refused", f"URLs with credentials are not fetched: {url.copy_with(userinfo=None)}")
                address = self.checked_address(url)
                extensions = {} if _is_ip(url.host) else {"sni_hostname": url.host}
                request = client.build_request(
                    "GET",
                    url.copy_with(host=address),
                    headers={"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"},
                    extensions=extensions,
                )
                try:
                    response = client.send(request, stream=True)
                except httpx.TimeoutException:
                    raise ToolError("timeout", f"Fetching the URL timed out after {self.timeout_s:g} s: {url}") from None
                except httpx.HTTPError as exc:
                    raise ToolError("url_fetch_failed", f"Fetching the URL failed ({exc}): {url}") from None
                try:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = url.join(response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise ToolError(
                            "url_fetch_failed", f"Fetching the URL failed: HTTP {response.status_code}: {url}"
                        )
                    data = self._read_capped(response, url, max_bytes, deadline)
                    content_type = response.headers.get("content-type")
                    return Fetched(
                        data=data,
                        media_type=content_type.split(";", 1)[0].strip().lower() if content_type else None,
                        file_name=file_name_from(url, response.headers.get("content-disposition")),
                        url=str(url),
                    )
                finally:
                    response.close()
        raise ToolError("url_fetch_failed", f"Too many redirects (more than {self._max_redirects}): {raw_url}")

    def _read_capped(self, response: httpx.Response, url: httpx.URL, max_bytes: int, deadline: float) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise ToolError("too_large", f"The file is {declared} bytes; at most {max_bytes} can be sent: {url}")
        chunks, total = [], 0
        try:
            for chunk in response.iter_raw():
                total += len(chunk)
                if total > max_bytes:
                    raise ToolError("too_large", f"The file is larger than {max_bytes} bytes, the most that can be sent: {url}")
                if time.monotonic() > deadline:
                    raise ToolError("timeout", f"Fetching the URL took longer than {self.timeout_s:g} s: {url}")
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise ToolError("timeout", f"Fetching the URL timed out after {self.timeout_s:g} s: {url}") from None
        except httpx.HTTPError as exc:
            raise ToolError("url_fetch_failed", f"Fetching the URL failed while reading ({exc}): {url}") from None
        return b"".join(chunks)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
