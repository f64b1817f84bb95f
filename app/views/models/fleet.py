"""The Overview at fleet scale: a GPU heat map and a node list, filtered and in pages.

Above ``dashboard.fleet_view_above_nodes`` nodes the Overview stops drawing one card with three
sparklines per node (1,000 cards were 2 MiB of HTML) and shows instead one small coloured cell
per GPU, grouped per node, problem nodes first, a page of nodes at a time. Both layouts judge the
nodes the same way (``overview.node_states``); this module only filters, orders and cuts pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import urlencode

from sqlmodel import Session

from app.series.store import SeriesStore
from app.views.models.overview import DashboardCaches, NodeCard, NodeStates, node_states

StateFilter = Literal["", "bad", "warn", "idle", "ok"]
TierFilter = Literal["", "light", "medium", "heavy"]

# Problems first: critical, then warning, then nodes without data, then the healthy ones.
LEVEL_ORDER = {"bad": 0, "warn": 1, "idle": 2, "ok": 3}
# 250 nodes x 8 GPUs is 2,000 cells, about 150 KiB of HTML: one screen of a 1,440 px wide
# browser, and the page stays well under the 300 KiB budget.
GRID_PAGE_NODES = 250
LIST_PAGE_NODES = 25
MAX_PAGE = 100_000  # bounds the page parameters (the 422 names the parameter beyond it)
MAX_JOB_FILTER = 128

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FleetFilters:
    """What the operator narrowed the fleet to: a job's nodes, a state, nodes with an open
    incident of a tier. Empty strings mean "any"."""

    job: str = ""
    state: str = ""
    tier: str = ""

    @property
    def active(self) -> bool:
        return bool(self.job or self.state or self.tier)

    def query(self, **pages: int) -> str:
        """The filters (and any page numbers above 1) as a query string, for links and polls."""
        params: dict[str, str | int] = {
            k: v for k, v in (("job", self.job), ("state", self.state), ("tier", self.tier)) if v
        }
        params.update({name: page for name, page in pages.items() if page > 1})
        return urlencode(params)

    def page_query(self, param: str, page: int) -> str:
        """``query`` with one page parameter named at run time (the pager's links)."""
        return self.query(**{param: page})


@dataclass(frozen=True, slots=True)
class Pager:
    page: int  # 1-based, clamped into 1..pages
    pages: int
    total: int
    size: int

    @property
    def first(self) -> int:
        """1-based position of the first item on this page (0 when there is none)."""
        return 0 if self.total == 0 else (self.page - 1) * self.size + 1

    @property
    def last(self) -> int:
        return min(self.total, self.page * self.size)

    @property
    def has_prev(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page < self.pages


def paginate(items: Sequence[T], *, page: int, size: int) -> tuple[list[T], Pager]:
    """One page of ``items``. A page past the end shows the last one: a poll that was on page 4
    when the problems shrank to three pages keeps showing something rather than an error."""
    pages = max(1, math.ceil(len(items) / size))
    page = min(max(1, page), pages)
    start = (page - 1) * size
    return list(items[start : start + size]), Pager(page, pages, len(items), size)


def select_nodes(
    cards: Sequence[NodeCard], filters: FleetFilters, job_nodes: set[str] | None
) -> list[NodeCard]:
    """The nodes the filters keep, problem nodes first, then by name.

    ``job_nodes`` are the nodes of ``filters.job`` (None when no job is asked for).
    """
    kept = [
        card
        for card in cards
        if (not filters.state or card.level == filters.state)
        and (not filters.tier or filters.tier in card.incident_tiers)
        and (job_nodes is None or card.name in job_nodes)
    ]
    kept.sort(key=lambda card: (LEVEL_ORDER.get(card.level, 9), card.name))
    return kept


# Judging 1,000 nodes x 8 GPUs is tens of ms of Python; the fleet view's partials (heat map, node
# list) and every viewer share one judgement. Younger than FRESH it is used as it is; younger than
# STALE it is used while one background thread judges again (the page is at most that much older
# than its data, and no request waits for the judgement); older, the request judges itself.
STATES_FRESH_SECONDS = 1.0
STATES_STALE_SECONDS = 10.0

TiersOf = Callable[[Session], dict[str, list[str]]]  # open incidents' tiers per node


@dataclass(frozen=True, slots=True)
class Judge:
    """What judging the fleet needs, besides a session: the same for a request and the thread."""

    caches: DashboardCaches
    store: SeriesStore
    suspect_after: float
    confirm_after: float
    incident_tiers_by_node: TiersOf

    def __call__(self, session: Session, now: float) -> NodeStates:
        return node_states(
            caches=self.caches,
            session=session,
            store=self.store,
            now=now,
            suspect_after=self.suspect_after,
            confirm_after=self.confirm_after,
            incident_tiers_by_node=self.incident_tiers_by_node(session),
        )


def shared_node_states(judge: Judge, session: Session, *, now: float) -> NodeStates:
    """Every node judged, at most ``STATES_STALE_SECONDS`` old (see above)."""
    return judge.caches.states.get(
        session,
        key=(id(judge.store), id(session.get_bind())),
        now=now,
        compute=judge,
        fresh_for=STATES_FRESH_SECONDS,
        stale_for=STATES_STALE_SECONDS,
    )
