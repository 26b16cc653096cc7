"""What collio shows of a URL: never the credentials in it.

A target or an endpoint may carry ``user:password@`` (an S3 endpoint with its keys, fsspec's
HTTP basic auth, ``s3://KEY:SECRET@bucket/...``).  Every error message, repr, statistic and
printed line that names one goes through :func:`redact_url` (a URL collio holds) or
:func:`redact_text` (a text that may quote one, such as a library's error message).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["redact_text", "redact_url", "secrets_in", "shown"]

#: What stands for the hidden part.
HIDDEN = "***"
#: A URL in free text: a scheme, ``://``, then up to a blank or a quote (the pieces
#: :func:`redact_url` then splits).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]+")
#: A user name or password shorter than this is not looked for alone in a text (it would
#: hide every such letter pair); the whole ``user:password`` is.
_MIN_PIECE = 4


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """``(head, userinfo, rest)`` of a URL whose user info is to be hidden, or None.

    A well-formed URL's user info is its netloc up to the LAST '@' (urllib's split; a
    password may hold '@').  A '/', '?' or '#' in a password ends urllib's netloc before
    the '@' (such a URL is malformed, and libraries quote it whole in their errors), and a
    string like ``htp:/u:pw@host`` has no netloc at all: when an '@' lies past the netloc,
    everything after the scheme up to the last '@' is hidden (a path holding an '@' then
    loses its host in messages: shown too little rather than a secret).
    """
    if "@" not in url:
        return None
    parts = urlsplit(url)
    if not parts.scheme:  # a local path ("/data/x@y") names no user
        return None
    head = parts.scheme + ":"
    after = url[len(head) :]
    if after.startswith("//"):
        head, after = head + "//", after[2:]
    if "@" in parts.netloc and after.startswith(parts.netloc):
        rest = after[len(parts.netloc) :]
        if "@" not in rest:
            user, _, host = parts.netloc.rpartition("@")
            return head, user, host + rest
    user, _, rest = after.rpartition("@")
    return (head, user, rest) if user or "@" in after else None


def redact_url(url: Any) -> Any:
    """``url`` with its ``user:password`` part replaced by ``***`` (None stays None; a
    URL without user info, or a local path, is returned as it is)."""
    if url is None:
        return None
    text = str(url)
    found = _userinfo(text)
    if found is None:
        return text
    head, _, rest = found
    return f"{head}{HIDDEN}@{rest}"


def secrets_in(url: Any) -> list[str]:
    """The pieces of ``url`` no text may show, longest first: its user info as given and
    percent-decoded, its user name and password alone (a library may quote any)."""
    if not isinstance(url, (str, os.PathLike)):
        return []
    found = _userinfo(str(os.fspath(url)))
    if found is None or not found[1]:
        return []
    userinfo = found[1]
    pieces = {userinfo, unquote(userinfo)}
    for piece in list(pieces):
        name, _, password = piece.partition(":")
        # (and the password up to a "/", "?", "#" or "@": where a parser may cut it)
        pieces.update((name, password, re.split(r"[/?#@]", password)[0]))
    return sorted(
        (p for p in pieces if len(p) >= _MIN_PIECE or p == userinfo), key=len, reverse=True
    )


def redact_text(text: str, *urls: Any) -> str:
    """``text`` with the credentials of every URL in it hidden.

    ``urls`` (targets, endpoints the text may be about) are hidden wherever a text quotes
    them or their pieces, however it cut them (a bucket name, a decoded password); any
    other ``scheme://...`` in the text loses its user info too.
    """
    for url in urls:
        pieces = secrets_in(url)
        if pieces:
            whole = str(os.fspath(url))
            text = text.replace(whole, redact_url(whole))
            for piece in pieces:
                text = text.replace(piece, HIDDEN)
    return _URL.sub(lambda m: redact_url(m.group()), text)


def shown(target: Any) -> str:
    """A target as messages and reprs quote it: a path or URL as ``repr`` of its redacted
    text; another object (a store, an array) as its repr, redacted."""
    if isinstance(target, (str, os.PathLike)):
        text = os.fspath(target)
        return repr(redact_url(os.fsdecode(text)))
    try:
        return redact_text(repr(target))
    except Exception:  # noqa: BLE001 - a repr that fails must not fail a message
        return f"<{type(target).__name__}>"
