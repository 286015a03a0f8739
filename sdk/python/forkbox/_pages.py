"""Pagination: the list calls (sandboxes, a ledger, checkpoints) answer a page
at a time, with a token for the next."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator

#: The page size of the helpers that list everything (the daemon's maximum).
FULL_PAGE = 1000


def pages(
    call: Callable[[str, Dict[str, Any]], Dict[str, Any]],
    method: str,
    message: Dict[str, Any],
    items: str,
) -> Iterator[Dict[str, Any]]:
    """Yields the ``items`` of every page of a list call, fetching the next
    page only when the previous one is used up."""
    token = message.get("pageToken", "")
    while True:
        r = call(method, {**message, "pageToken": token})
        yield from r.get(items) or []
        token = r.get("nextPageToken") or ""
        if not token:
            return
