"""The fleet Overview in real Chromium: 1,000 nodes x 8 GPUs on a real ``rlguard server``, every
node's batch through ``POST /api/v1/ingest`` as its agent would send it.

The heat map renders (one cell per GPU, 250 nodes a page), problem nodes come first, the state
filter narrows it, the pager moves to the next page, and a click on a cell opens the node's page.
Heartbeat bounds are raised for this server (``RLGUARD_POLICY__DETECTION__HEARTBEAT__*``) so that 1,000 nodes
reporting once stay alive for the test; the policy scheduler is off (the overview is the subject,
and a 1,000-node tick would only slow a shared machine). The screenshot lands in
``artifacts/screenshots/overview-fleet-desktop.png`` (the committed copy is in docs/screenshots/).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from tests.e2e._cluster import PASSWORDS, _cli, screenshot, sign_in
from tests.harness import RLGUARD, ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = [f"gpu-node-{i:04d}" for i in range(1000)]
GPUS = 8
HOT = {"gpu-node-0017": 3, "gpu-node-0512": 0, "gpu-node-0777": 6}  # node -> GPU at 95 °C
WARM = {"gpu-node-0042": 5, "gpu-node-0600": 1}  # node -> GPU at 85 °C
SILENT = ("gpu-node-0100", "gpu-node-0901")  # registered, never report: no data
PROBLEMS = [*sorted(HOT), *sorted(WARM), *sorted(SILENT)]  # the order the Overview shows
GIB = 2**30
WAIT_MS = 60_000  # a loaded machine judging 1,000 nodes per partial


@dataclass
class Fleet:
    base_url: str


def _samples(node: str, ts: float) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for gpu in range(GPUS):
        temp = 60.0 + gpu
        if HOT.get(node) == gpu:
            temp = 95.0
        elif WARM.get(node) == gpu:
            temp = 85.0
        values = {
            "gpu_utilization_ratio": 0.8 + gpu / 100,
            "gpu_temperature_celsius": temp,
            "gpu_memory_used_bytes": 60.0 * GIB,
            "gpu_memory_total_bytes": 80.0 * GIB,
            "gpu_power_watts": 550.0,
        }
        out.extend(
            {"name": name, "value": v, "ts": ts, "labels": {"gpu": str(gpu)}}
            for name, v in values.items()
        )
    return out


def _node_tokens(database_url: str) -> dict[str, str]:
    """One token per node, as ``rlguard token create --node`` issues them (1,000 CLI processes
    would take minutes on a shared machine): the same function, in one transaction."""
    from app.auth.tokens import create_node_token
    from app.core.db import make_engine

    engine = make_engine(database_url)
    try:
        with Session(engine) as session:
            tokens = {node: create_node_token(session, node=node, actor="e2e")[1] for node in NODES}
            session.commit()
    finally:
        engine.dispose()
    return tokens


def _report(base_url: str, tokens: dict[str, str]) -> None:
    """Every node but the silent ones posts one batch, as its agent would."""
    import time

    def post(nodes: list[str]) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for node in nodes:
                body = {
                    "agent_id": f"agent-{node}",
                    "node": node,
                    "seq": 1,
                    "sent_at": time.time(),
                    "samples": _samples(node, time.time()),
                    "participants": [],
                }
                r = client.post(
                    "/api/v1/ingest",
                    json=body,
                    headers={"Authorization": f"Bearer {tokens[node]}"},
                )
                assert r.status_code == 200, (node, r.text)

    reporting = [n for n in NODES if n not in SILENT]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(post, reporting[i::2]) for i in range(2)]:
            done.result()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    data_dir: Path = tmp_path_factory.mktemp("rlguard-e2e-fleet")
    port = free_port()
    env = {
        **os.environ,
        "RLGUARD_DATA_DIR": str(data_dir),
        "RLGUARD_SECRET_KEY": secrets.token_urlsafe(32),
        "RLGUARD_HOST": "127.0.0.1",
        "RLGUARD_PORT": str(port),
        "RLGUARD_POLICY_SCHEDULER": "0",
        "RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS": "3600",
        "RLGUARD_POLICY__DETECTION__HEARTBEAT__CONFIRM_SECONDS": "7200",
    }
    for key in ("RLGUARD_DATABASE_URL", "RLGUARD_REDIS_URL", "RLGUARD_DEV", "RLGUARD_ALERTS_FILE"):
        env.pop(key, None)
    _cli(env, "db", "upgrade")
    _cli(env, "user", "create", "alice", "--role", "approver", "--password-stdin",
         stdin=PASSWORDS["alice"] + "\n")  # fmt: skip
    tokens = _node_tokens(f"sqlite:///{data_dir / 'rlguard.db'}")
    argv = [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)]
    server = ServerProcess(argv, env, port, data_dir / "server.log", ready_path="/healthz")
    try:
        server.start()
        _report(server.url, tokens)
        yield Fleet(server.url)
    finally:
        server.stop(timeout=20)


@pytest.fixture(scope="module")
def page(fleet: Fleet, browser: object) -> Iterator[object]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})  # type: ignore[attr-defined]
    p = ctx.new_page()
    p.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    p.js_errors = errors
    sign_in(p, fleet.base_url, "alice")
    yield p
    ctx.close()


def _scroll_to_the_end(page: object) -> None:
    """Brings the lazily loaded parts below the grid into view ("revealed"). By script, in one
    step: the panels are swapped by htmx (loaded, then polled) while an element scroll waits."""
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # type: ignore[attr-defined]


def _grid_nodes(page: object) -> list[str]:
    return page.eval_on_selector_all(  # type: ignore[attr-defined,no-any-return]
        "[data-testid=fleet-grid] a.hm", "els => els.map(e => e.dataset.node)"
    )


def test_fleet_grid_renders_problem_nodes_first(fleet: Fleet, page: object) -> None:
    assert page.url == f"{fleet.base_url}/"  # type: ignore[attr-defined]
    page.wait_for_selector("[data-testid=fleet-grid]")  # type: ignore[attr-defined]
    nodes = _grid_nodes(page)
    assert len(nodes) == 250
    assert nodes[: len(PROBLEMS)] == PROBLEMS
    levels = page.eval_on_selector_all(  # type: ignore[attr-defined]
        "[data-testid=fleet-grid] a.hm", "els => els.map(e => e.dataset.level)"
    )
    assert levels[: len(PROBLEMS)] == ["bad"] * 3 + ["warn"] * 2 + ["idle"] * 2
    assert set(levels[len(PROBLEMS) :]) == {"ok"}
    assert page.locator("[data-testid=fleet-grid] a.hm i").count() == 248 * GPUS + 2  # type: ignore[attr-defined]
    hot = page.locator('a.hm[data-node="gpu-node-0017"] i.bad')  # type: ignore[attr-defined]
    assert hot.get_attribute("title") == "gpu-node-0017 · GPU 3: 83% util, 95 °C — 95 °C"
    assert page.inner_text("[data-testid=nodes-healthy]").split() == ["993", "/", "1000"]  # type: ignore[attr-defined]
    # The parts below the grid load when scrolled into view ("revealed").
    _scroll_to_the_end(page)
    page.wait_for_selector("[data-testid=fleet-node-list] tr[data-node]")  # type: ignore[attr-defined]
    page.wait_for_selector("#overview-jobs .panel-head")  # type: ignore[attr-defined]
    page.wait_for_selector("#overview-incidents .panel-head")  # type: ignore[attr-defined]
    listed = page.eval_on_selector_all(  # type: ignore[attr-defined]
        "[data-testid=fleet-node-list] tr[data-node]", "els => els.map(e => e.dataset.node)"
    )
    assert listed == PROBLEMS + [n for n in NODES if n not in PROBLEMS][:18]
    page.evaluate("window.scrollTo(0, 0)")  # type: ignore[attr-defined]
    screenshot(page, "overview-fleet-desktop")
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_state_filter_narrows_the_grid(fleet: Fleet, page: object) -> None:
    page.goto(f"{fleet.base_url}/")  # type: ignore[attr-defined]
    page.wait_for_selector("[data-testid=fleet-grid]")  # type: ignore[attr-defined]
    page.select_option("#f-state", "bad")  # type: ignore[attr-defined]
    expect(page.locator("[data-testid=fleet-grid] a.hm")).to_have_count(3, timeout=WAIT_MS)  # type: ignore[attr-defined]
    assert _grid_nodes(page) == sorted(HOT)
    assert "state=bad" in page.url  # type: ignore[attr-defined]  # the filtered view has an address
    _scroll_to_the_end(page)
    rows = page.locator("[data-testid=fleet-node-list] tr[data-node]")  # type: ignore[attr-defined]
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    page.select_option("#f-state", "idle")  # type: ignore[attr-defined]
    expect(page.locator("[data-testid=fleet-grid] a.hm")).to_have_count(2, timeout=WAIT_MS)  # type: ignore[attr-defined]
    assert _grid_nodes(page) == list(SILENT)
    # The form came back with the page: its values and a way back to the whole fleet.
    assert page.input_value("#f-state") == "idle"  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        page.click("[data-testid=fleet-clear]")  # type: ignore[attr-defined]
    expect(page.locator("[data-testid=fleet-grid] a.hm")).to_have_count(250, timeout=WAIT_MS)  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_pager_moves_to_the_next_page(fleet: Fleet, page: object) -> None:
    page.goto(f"{fleet.base_url}/")  # type: ignore[attr-defined]
    page.wait_for_selector("[data-testid=page-pager][data-page='1'][data-pages='4']")  # type: ignore[attr-defined]
    first = _grid_nodes(page)
    page.click("[data-testid=page-pager] a[rel=next]")  # type: ignore[attr-defined]
    page.wait_for_selector("[data-testid=page-pager][data-page='2']")  # type: ignore[attr-defined]
    second = _grid_nodes(page)
    assert len(second) == 250 and not set(first) & set(second)
    healthy = [n for n in NODES if n not in PROBLEMS]
    assert second == healthy[243:493]  # page 1 held the 7 problem nodes and 243 healthy ones
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_a_click_on_a_cell_opens_the_node_page(fleet: Fleet, page: object) -> None:
    page.goto(f"{fleet.base_url}/")  # type: ignore[attr-defined]
    cell = page.wait_for_selector('a.hm[data-node="gpu-node-0512"] i.bad')  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        cell.click()
    assert page.url == f"{fleet.base_url}/nodes/gpu-node-0512"  # type: ignore[attr-defined]
    assert "gpu-node-0512" in page.inner_text("h1")  # type: ignore[attr-defined]
    assert page.js_errors == []  # type: ignore[attr-defined]
