"""docker-compose.yml, Dockerfile and .env.example: every service runs a real entry point.

No Docker engine runs here, so the files are checked for what would break at ``docker compose
up``: a command that the project's CLI parsers refuse, a variable without a value, a root image.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import typer.main
import yaml
from typer._click.exceptions import UsageError

from agents.__main__ import build_parser as agent_parser
from app import cli as rlguard_cli

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
IMAGE = "${RLGUARD_IMAGE:-rlguard:latest}"
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?]([^}]*))?\}")

pytestmark = [pytest.mark.timeout(60)]


class CommandRefused(Exception):
    """The project's CLI would refuse this command line."""


def _interpolate(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        assert default is not None and "?" not in m.group(0), f"{name} has no value"
        return default

    return _VAR.sub(sub, text)


def _example_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value or f"filled-{key.lower()}"
    return env


def check_rlguard_command(argv: list[str]) -> None:
    """Parse ``argv`` with the real CLI parsers (nothing runs); raise if they refuse it."""
    assert argv[0] == "rlguard", f"{argv}: not the project's entry point"
    if argv[1] == "agent":
        agent_parser().parse_args(argv[2:])
        return
    cmd = typer.main.get_command(rlguard_cli.cli)
    args = list(argv[1:])
    # typer vendors its own click: walk the groups by their command tables, then let the leaf
    # command parse its options exactly as it would at run time.
    while hasattr(cmd, "commands"):
        assert args, f"{argv}: names a command group, not a command"
        name, args = args[0], args[1:]
        sub = cmd.commands.get(name)
        if sub is None:
            raise CommandRefused(f"{argv}: no command {name!r}")
        cmd = sub
    try:
        cmd.make_context(argv[1], args)
    except UsageError as exc:
        raise CommandRefused(f"{argv}: {exc}") from exc


def project_services() -> dict[str, dict]:
    return {n: s for n, s in SERVICES.items() if s.get("image") == IMAGE}


def test_compose_has_the_whole_shape() -> None:
    assert {
        "postgres",
        "redis",
        "migrate",
        "server",
        "proxy",
        "worker",
        "node-1-agent",
        "node-1-worker",
    } <= set(SERVICES)
    assert set(COMPOSE["volumes"]) >= {"postgres-data", "redis-data"}
    # Everything long-running has a healthcheck; migrate runs once and the others wait for it.
    for name, svc in SERVICES.items():
        if name != "migrate":
            assert "healthcheck" in svc, name
    assert SERVICES["migrate"]["restart"] == "no"
    server = SERVICES["server"]
    assert server["deploy"]["replicas"] == 2
    assert server["environment"]["RLGUARD_SERIES__SHARED_WINDOW"] == "true"
    assert server["environment"]["RLGUARD_REDIS_URL"] == "redis://redis:6379/0"
    for name in ("server", "worker", "node-1-agent", "node-1-worker"):
        deps = SERVICES[name]["depends_on"]
        if name == "node-1-agent":
            assert deps["proxy"]["condition"] == "service_healthy"
        else:
            assert deps["migrate"]["condition"] == "service_completed_successfully", name


def test_every_project_service_runs_a_real_entry_point() -> None:
    env = _example_env()
    services = project_services()
    assert len(services) >= 5
    for name, svc in services.items():
        argv = [_interpolate(str(a), env) for a in svc["command"]]
        try:
            check_rlguard_command(argv)
        except (CommandRefused, SystemExit) as exc:
            pytest.fail(f"service {name}: {argv} is refused by the CLI: {exc}")
    assert SERVICES["migrate"]["command"] == ["rlguard", "db", "upgrade"]


def test_the_command_check_refuses_what_the_cli_refuses() -> None:
    for bad in (
        ["rlguard", "serve"],
        ["rlguard", "server", "--prot", "8000"],
        ["rlguard", "db", "upgrad"],
        ["rlguard", "worker", "--concurrency", "many"],
        ["python", "-m", "app"],
    ):
        with pytest.raises((CommandRefused, AssertionError)):
            check_rlguard_command(bad)
    with pytest.raises(SystemExit):
        check_rlguard_command(["rlguard", "agent", "--server", "http://x", "--interval", "-1"])


def test_every_variable_compose_needs_is_in_env_example() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    required = {m.group(1) for m in _VAR.finditer(text) if "?" in m.group(0)}
    optional = {m.group(1) for m in _VAR.finditer(text)} - required
    example = _example_env()
    assert required <= set(example), required - set(example)
    assert optional - {"RLGUARD_IMAGE"} <= set(example), optional - set(example)
    # The compose file itself never carries a secret.
    assert "RLGUARD_SECRET_KEY: ${RLGUARD_SECRET_KEY:?" in text
    with pytest.raises(AssertionError, match="RLGUARD_SECRET_KEY has no value"):
        _interpolate("${RLGUARD_SECRET_KEY:?set it}", {})


def test_dockerfile_is_slim_non_root_with_cpu_torch() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms and all("-slim" in f for f in froms)
    final = lines[lines.index(froms[-1]) :]
    user = [ln for ln in final if ln.startswith("USER ")]
    assert user and not user[-1].split()[1].startswith(("root", "0"))
    assert any(ln.startswith("HEALTHCHECK") for ln in final)
    torch = [ln for ln in lines if "torch==" in ln]
    assert torch == [
        "RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    ]
    assert 'CMD ["rlguard", "server"]' in final
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".env", "data"} <= set(ignored)
    # What the image copies exists (a renamed directory would break the build).
    for ln in lines:
        if ln.startswith("COPY ") and "--from" not in ln:
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), src


def test_proxy_config_points_at_the_server_service() -> None:
    conf = (ROOT / "deploy/nginx/rlguard.conf").read_text()
    assert "server server:8000" in conf
    mount = SERVICES["proxy"]["volumes"][0].split(":")[0]
    assert (ROOT / mount).resolve() == (ROOT / "deploy/nginx/rlguard.conf").resolve()
    assert os.path.getsize(ROOT / "deploy/nginx/rlguard.conf") > 0
