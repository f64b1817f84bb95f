"""The engine client drops an idle connection before vLLM's server does: with both at 5 s a
request could go out on a connection the server was closing ("Server disconnected without
sending a response"), which failed a refit and quarantined a healthy engine."""

from __future__ import annotations

from integrations.vllm.client import KEEPALIVE_EXPIRY_S, EngineClient


def test_idle_connections_expire_before_the_server_closes_them() -> None:
    import vllm.envs

    server_keep_alive = float(vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
    assert KEEPALIVE_EXPIRY_S < server_keep_alive
    client = EngineClient("http://127.0.0.1:1", "m")
    try:
        pool = client._http._transport._pool  # httpx's connection pool (httpcore)
        assert pool._keepalive_expiry == KEEPALIVE_EXPIRY_S
    finally:
        client.close()
