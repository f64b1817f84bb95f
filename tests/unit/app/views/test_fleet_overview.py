"""The Overview's fleet view (more nodes than ``dashboard.fleet_view_above_nodes``): the first
response is a small shell whose parts load lazily; the heat map has one cell per GPU, grouped per
node, problem nodes first; filters (job, state, tier) and pages narrow it; a bad query parameter
is a 422 naming it; at or under the threshold the node cards stay."""

from __future__ import annotations

import re
import time

import pytest

from app.core.config import DashboardSettings
from app.models import Job, Node, Participant, from_epoch
from app.models.incident import Incident
from app.series.store import SeriesKey
from tests.harness.dashboard import Browser, DashboardApp, login
from tests.harness.waiting import wait_for

HX = {"HX-Request": "true"}
GPUS = 4


def _fleet_view_above(dash: DashboardApp, nodes: int) -> None:
    settings = dash.app.state.settings
    dash.app.state.settings = settings.model_copy(
        update={"dashboard": DashboardSettings(fleet_view_above_nodes=nodes)}
    )


def _seed(dash: DashboardApp, count: int, *, gpus: int = GPUS) -> list[str]:
    """``count`` live nodes with ``gpus`` GPUs; node-003 has a GPU at 95 °C (critical), node-005
    one at 85 °C (warning), node-007 has been silent for 30 s (suspected); job grpo-a runs on the
    even nodes; node-004 has an open light incident, node-006 a heavy one."""
    now = time.time()
    names = [f"node-{i:03d}" for i in range(count)]
    with dash.session() as s:
        for name in names:
            age = 30.0 if name == "node-007" else 1.0
            s.add(Node(name=name, last_seen_at=from_epoch(now - age)))
        s.add(Job(name="grpo-a", last_seen_at=from_epoch(now)))
        s.add(Job(name="grpo-b", last_seen_at=from_epoch(now)))
        s.flush()
        for rank, name in enumerate(names[::2]):
            s.add(
                Participant(
                    job_name="grpo-a",
                    role="trainer",
                    rank=rank,
                    node_name=name,
                    phase="TRAIN",
                    step=7,
                    last_heartbeat_at=from_epoch(now),
                )
            )
        for node, tier in (("node-004", "light"), ("node-006", "heavy")):
            if node in names:
                key = f"test_fault:node={node}"
                s.add(
                    Incident(
                        key=key,
                        open_key=key,
                        kind="test_fault",
                        tier=tier,
                        subject={"node": node},
                        node=node,
                        summary=f"test fault on {node}",
                        evidence={},
                    )
                )
        s.commit()
    samples = []
    for name in names:
        for gpu in range(gpus):
            labels = {"gpu": str(gpu)}
            temp = 60.0 + gpu
            if (name, gpu) == ("node-003", 2):
                temp = 95.0
            elif (name, gpu) == ("node-005", 1):
                temp = 85.0
            samples.append((SeriesKey.of(name, "gpu_temperature_celsius", labels), now - 1, temp))
            samples.append((SeriesKey.of(name, "gpu_utilization_ratio", labels), now - 1, 0.9))
    dash.store.extend(samples)
    return names


def _grid_nodes(html: str) -> list[tuple[str, str]]:
    return re.findall(
        r'<a class="hm \w+" href="[^"]+" data-node="([^"]+)" data-level="(\w+)"', html
    )


def test_fleet_overview_is_a_small_shell_whose_parts_load_lazily(
    client: Browser, dash: DashboardApp
) -> None:
    _fleet_view_above(dash, 8)
    _seed(dash, 9)
    login(client, "vera")
    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    assert "node-card" not in html and 'class="hm ' not in html  # nothing judged here
    for part in (
        "/ui/overview/fleet",
        "/ui/overview/fleet/nodes",
        "/ui/overview/incidents",
        "/ui/overview/jobs",
        "/ui/overview/goodput",
        "/ui/overview/breakers",
    ):
        assert re.search(rf'hx-get="{re.escape(part)}" hx-trigger="(load|revealed)"', html), part
    assert 'data-testid="fleet-filters"' in html
    assert '<option value="grpo-a"' in html and '<option value="grpo-b"' in html
    for part in ("/ui/overview/fleet", "/ui/overview/fleet/nodes"):
        r = client.get(part, headers=HX)
        assert r.status_code == 200 and "<html" not in r.text
        assert 'hx-swap="outerHTML"' in r.text and 'hx-trigger="every' in r.text


def test_heat_map_has_a_cell_per_gpu_problem_nodes_first(
    client: Browser, dash: DashboardApp
) -> None:
    _fleet_view_above(dash, 8)
    _seed(dash, 12)
    login(client, "vera")
    html = client.get("/ui/overview/fleet", headers=HX).text
    nodes = _grid_nodes(html)
    assert [n for n, _ in nodes[:4]] == ["node-003", "node-006", "node-004", "node-005"]
    assert [lv for _, lv in nodes[:4]] == ["bad", "bad", "warn", "warn"]
    assert nodes[4] == ("node-007", "warn")  # silent 30 s: suspected
    assert [lv for _, lv in nodes[5:]] == ["ok"] * 7
    assert [n for n, _ in nodes[5:]] == sorted(n for n, _ in nodes[5:])
    heatmap = html.split('data-testid="fleet-grid"', 1)[1]
    assert heatmap.count("<i class=") == 12 * GPUS
    # The cell's tooltip carries the figures; the node's group links to the node page.
    assert 'title="node-003 · GPU 2: 90% util, 95 °C — 95 °C"' in html
    assert 'href="/nodes/node-003" data-node="node-003"' in html
    assert 'data-testid="nodes-healthy">7<' in html  # the tiles come with the grid
    assert "12 nodes" in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=bad", ["node-003", "node-006"]),
        ("state=warn", ["node-004", "node-005", "node-007"]),
        ("tier=heavy", ["node-006"]),
        ("tier=light", ["node-004"]),
        ("job=grpo-a&state=bad", ["node-006"]),
        ("job=grpo-a", ["node-006", "node-004", "node-000", "node-002", "node-008", "node-010"]),
        ("job=grpo-b", []),
        ("job=nobody", []),
    ],
)
def test_filters_narrow_the_grid_and_the_node_list(
    client: Browser, dash: DashboardApp, query: str, expected: list[str]
) -> None:
    _fleet_view_above(dash, 8)
    _seed(dash, 12)
    login(client, "vera")
    grid = client.get(f"/ui/overview/fleet?{query}", headers=HX).text
    assert [n for n, _ in _grid_nodes(grid)] == expected
    listed = client.get(f"/ui/overview/fleet/nodes?{query}", headers=HX).text
    assert re.findall(r'<tr data-node="([^"]+)"', listed) == expected
    if not expected:
        assert "No node matches these filters." in grid
    # The poll keeps the filters: the partial asks for itself with the same query.
    assert f'hx-get="/ui/overview/fleet?{query.replace("&", "&amp;")}"' in grid
    # The page itself, with the filters, keeps them in its lazy parts and its form.
    page = client.get(f"/?{query}").text
    assert f'hx-get="/ui/overview/fleet?{query.replace("&", "&amp;")}" hx-trigger="load"' in page


def test_pages_of_the_grid_node_list_and_incidents(client: Browser, dash: DashboardApp) -> None:
    _fleet_view_above(dash, 8)
    names = _seed(dash, 260, gpus=1)
    with dash.session() as s:
        for i in range(14):
            key = f"other_fault:{i}"
            s.add(
                Incident(
                    key=key,
                    open_key=key,
                    kind="other_fault",
                    tier="light",
                    subject={},
                    job="grpo-b",
                    summary=f"fault {i}",
                    evidence={},
                )
            )
        s.commit()
    login(client, "vera")
    first = client.get("/ui/overview/fleet", headers=HX).text
    second = client.get("/ui/overview/fleet?page=2", headers=HX).text
    on_first, on_second = _grid_nodes(first), _grid_nodes(second)
    assert len(on_first) == 250 and len(on_second) == 10
    # Problems first, on the first page (one GPU each: the hot GPUs 1 and 2 are not there).
    assert on_first[:4] == [
        ("node-006", "bad"),
        ("node-004", "warn"),
        ("node-007", "warn"),
        ("node-000", "ok"),
    ]
    assert sorted(n for n, _ in on_first + on_second) == names
    assert 'data-testid="page-pager" data-page="1" data-pages="2"' in first
    assert 'rel="next" href="/?page=2" hx-get="/ui/overview/fleet?page=2"' in first
    assert 'hx-get="/ui/overview/fleet?page=2" hx-trigger="every' in second  # polls its page
    # A page past the end (the list shrank since the link was drawn) shows the last page.
    assert _grid_nodes(client.get("/ui/overview/fleet?page=9", headers=HX).text) == on_second
    listed = client.get("/ui/overview/fleet/nodes?nodes_page=11", headers=HX).text
    assert len(re.findall(r"<tr data-node=", listed)) == 10
    assert "251–260 of 260 · page 11 of 11" in listed
    # Open incidents: 12 a page; 16 open (2 seeded by _seed, 14 here).
    inc1 = client.get("/ui/overview/incidents", headers=HX).text
    inc2 = client.get("/ui/overview/incidents?incidents_page=2", headers=HX).text
    assert inc1.count("<tr data-incident=") == 12 and inc2.count("<tr data-incident=") == 4
    assert "13–16 of 16 · page 2 of 2" in inc2
    narrowed = client.get("/ui/overview/incidents?tier=heavy", headers=HX).text
    assert narrowed.count("<tr data-incident=") == 1 and "test fault on node-006" in narrowed


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("state=purple", "state"),
        ("tier=severe", "tier"),
        ("page=0", "page"),
        ("page=two", "page"),
        ("page=100001", "page"),
        ("nodes_page=-1", "nodes_page"),
        ("incidents_page=x", "incidents_page"),
        ("job=" + "j" * 129, "job"),
    ],
)
def test_bad_filter_or_page_is_a_422_naming_the_parameter(
    client: Browser, dash: DashboardApp, query: str, name: str
) -> None:
    _fleet_view_above(dash, 8)
    _seed(dash, 9)
    login(client, "vera")
    paths = ["/", "/ui/overview/fleet", "/ui/overview/fleet/nodes", "/ui/overview/incidents"]
    for path in paths:
        accepts = {
            "page": path in ("/", "/ui/overview/fleet"),
            "nodes_page": path in ("/", "/ui/overview/fleet/nodes"),
            "incidents_page": path in ("/", "/ui/overview/incidents"),
        }
        if not accepts.get(name, True):
            continue  # a parameter a partial does not take is not its to refuse
        r = client.get(f"{path}?{query}", headers=HX if path != "/" else None)
        assert r.status_code == 422, (path, query, r.status_code)
        assert r.headers["X-RLGuard-Reason"].startswith(f"{name}: "), (path, r.headers)
        assert "Bad request" in r.text


def test_at_the_threshold_the_node_cards_stay(client: Browser, dash: DashboardApp) -> None:
    _fleet_view_above(dash, 9)
    _seed(dash, 9)
    login(client, "vera")
    html = client.get("/").text
    assert html.count('class="node-card') == 9
    assert 'id="fleet-grid"' not in html
    assert 'data-node="node-003" data-level="bad"' in html


def test_one_judgement_of_the_fleet_is_shared_then_judged_again_in_the_background(
    dash: DashboardApp,
) -> None:
    from app.views.models import fleet
    from app.views.models.incidents import open_tiers_by_node
    from app.views.models.overview import DashboardCaches

    _seed(dash, 9)
    judge = fleet.Judge(
        caches=DashboardCaches(),
        store=dash.store,
        suspect_after=15,
        confirm_after=60,
        incident_tiers_by_node=open_tiers_by_node,
    )
    t0 = time.time()
    with dash.session() as s:
        first = fleet.shared_node_states(judge, s, now=t0)
        assert first.nodes_total == 9
        assert fleet.shared_node_states(judge, s, now=t0 + 0.5) is first  # fresh: as it is
        s.add(Node(name="node-late", last_seen_at=from_epoch(t0)))
        s.commit()
        # Past FRESH, within STALE: the same judgement at once, a new one judged by a thread.
        assert fleet.shared_node_states(judge, s, now=t0 + 2) is first
        wait_for(
            lambda: judge.caches.states.value is not first,
            what="the background judgement",
            interval=0.01,
        )
        again = judge.caches.states.value
        assert again is not None and again.nodes_total == 10
        # Past STALE: the request judges itself.
        s.add(Node(name="node-later", last_seen_at=from_epoch(t0)))
        s.commit()
        late = fleet.shared_node_states(judge, s, now=t0 + fleet.STATES_STALE_SECONDS + 60)
        assert late.nodes_total == 11


def test_cluster_ettr_tiles_are_shared_for_30_seconds(dash: DashboardApp) -> None:
    from app.views.models.ettr_tiles import ETTR_TILES_MAX_AGE_SECONDS, cluster_tiles_shared
    from app.views.models.overview import DashboardCaches

    caches = DashboardCaches()
    now = time.time()
    with dash.session() as s:
        s.add(Job(name="grpo-a", last_seen_at=from_epoch(now)))
        s.commit()
        first = cluster_tiles_shared(caches, s, settings=dash.settings, now=now)
        assert [t.jobs for t in first] == [1, 1]
        s.add(Job(name="grpo-b", last_seen_at=from_epoch(now)))
        s.commit()
        assert cluster_tiles_shared(caches, s, settings=dash.settings, now=now + 29) is first
        later = now + ETTR_TILES_MAX_AGE_SECONDS
        assert [
            t.jobs for t in cluster_tiles_shared(caches, s, settings=dash.settings, now=later)
        ] == [2, 2]
