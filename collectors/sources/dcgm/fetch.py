"""Fetching a scrape's text: an http(s) URL or a file, bounded in size, decoded strictly;
DcgmFetchError names the file or URL."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from faultlens.collectors.sources.dcgm.metrics import MAX_SCRAPE_CHARS, MIB
from faultlens.errors import FaultlensError


class DcgmFetchError(OSError, FaultlensError):
    """A scrape cannot be fetched or read: the message names the file or URL."""


def fetch_scrape(location: str, *, timeout_s: float = 5.0) -> str:
    """The text of a scrape: an http(s) URL is fetched, anything else is read as a file. Raises
    DcgmFetchError.
    """
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=timeout_s) as response:
                body = response.read(MAX_SCRAPE_CHARS)
                charset = response.headers.get_content_charset() or "utf-8"
        except urllib.error.HTTPError as exc:
            raise DcgmFetchError(f"dcgm {location}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DcgmFetchError(f"dcgm {location}: cannot fetch: {reason}") from None
        try:
            return body.decode(charset, "strict")
        except (UnicodeDecodeError, LookupError):
            raise DcgmFetchError(f"dcgm {location}: the response is not {charset} text") from None
    file = Path(location)
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_SCRAPE_CHARS + 1)
    except IsADirectoryError:
        raise DcgmFetchError(f"dcgm {file}: is a directory, expected a scrape file") from None
    except OSError as exc:
        raise DcgmFetchError(f"dcgm {file}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_SCRAPE_CHARS:
        raise DcgmFetchError(
            f"dcgm {file}: larger than {MAX_SCRAPE_CHARS // MIB} MiB, not a scrape"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DcgmFetchError(f"dcgm {file}: not UTF-8 text (byte {exc.start})") from None
