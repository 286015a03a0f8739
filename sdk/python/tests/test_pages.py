"""The list helpers follow pages, against a small fake daemon on a unix socket
that serves pages of a list with offsets as tokens: iter_sandboxes fetches a
page at a time (and no further once the loop stops), list_sandboxes and
events collect every page, a bad token is InvalidArgumentError."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import forkbox
from test_unit import S, FakeServer


class PagedRoutes(dict):  # type: ignore[type-arg]
    """Answers ListSandboxes and Events with pages of n items, read from the
    request the fake server recorded last."""

    def __init__(self, fake: FakeServer, n: int) -> None:
        super().__init__()
        self.fake, self.n = fake, n
        self.asked: List[Dict[str, Any]] = []

    def __getitem__(self, path: str) -> Tuple[int, str, bytes]:
        req = json.loads(self.fake.requests[-1][2])
        self.asked.append(req)
        token = req.get("pageToken", "")
        if token and not token.isdigit():
            err = {"code": "invalid_argument", "message": "page token is not valid for this request"}
            return 400, "application/json", json.dumps(err).encode()
        start, size = int(token or 0), int(req.get("pageSize") or 100)
        ids = range(start, min(start + size, self.n))
        nxt = str(start + size) if start + size < self.n else ""
        if path == S + "ListSandboxes":
            body: Dict[str, Any] = {"sandboxes": [{"id": f"sb-{i}", "name": f"n{i}"} for i in ids]}
        else:
            body = {"events": [{"seq": str(i + 1), "type": "exec.started", "dataJson": "{}"} for i in ids]}
        if nxt:
            body["nextPageToken"] = nxt
        return 200, "application/json", json.dumps(body).encode()


@pytest.fixture
def paged() -> Iterator[Tuple[forkbox.Client, PagedRoutes]]:
    srv = FakeServer({})
    routes = PagedRoutes(srv, 250)
    srv.routes = routes
    c = forkbox.Client(socket=srv.path)
    yield c, routes
    c.close()
    srv.close()


def test_iter_sandboxes_every_one_once(paged: Tuple[forkbox.Client, PagedRoutes]) -> None:
    c, routes = paged
    ids = [sb.id for sb in c.iter_sandboxes(page_size=40)]
    assert len(ids) == 250 and len(set(ids)) == 250
    assert [r["pageSize"] for r in routes.asked] == [40] * 7


def test_iter_sandboxes_stops_fetching(paged: Tuple[forkbox.Client, PagedRoutes]) -> None:
    c, routes = paged
    for i, _ in enumerate(c.iter_sandboxes(page_size=10)):
        if i == 14:
            break
    assert len(routes.asked) == 2


def test_list_helpers_collect_every_page(paged: Tuple[forkbox.Client, PagedRoutes]) -> None:
    c, routes = paged
    routes.n = 2500
    assert len(c.list_sandboxes()) == 2500
    assert routes.asked[0]["pageSize"] == forkbox.client.FULL_PAGE
    assert len(routes.asked) == 3
    evs = c.events("sb-1")
    assert [e.seq for e in evs[:3]] == [1, 2, 3] and len(evs) == 2500


def test_one_page_and_bad_token(paged: Tuple[forkbox.Client, PagedRoutes]) -> None:
    c, _ = paged
    p = c.list_sandboxes_page(page_size=2)
    assert [s.id for s in p.sandboxes] == ["sb-0", "sb-1"] and p.next_page_token == "2"
    assert c.list_sandboxes_page(page_size=10, page_token="240").next_page_token == ""
    with pytest.raises(forkbox.InvalidArgumentError, match="page token"):
        list(c.iter_sandboxes(page_token="1' OR '1'='1"))


def test_async_iter_sandboxes(paged: Tuple[forkbox.Client, PagedRoutes]) -> None:
    c, _ = paged

    async def run() -> List[str]:
        ac = forkbox.AsyncClient(socket=c._transport.where)
        try:
            return [sb.id async for sb in ac.iter_sandboxes(page_size=64)]
        finally:
            await ac.close()

    ids = asyncio.run(run())
    assert len(ids) == 250 and len(set(ids)) == 250
