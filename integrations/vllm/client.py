"""The HTTP calls a job makes to one vLLM OpenAI server: completions with logprobs and a seed,
and the development-mode control routes (``/collective_rpc``, ``/sleep``, ``/wake_up``).

Every call has a timeout. A failure of the engine (connection refused or reset, a 5xx, a
timeout) raises :class:`EngineUnavailable`: the caller's router quarantines the engine and
retries the request elsewhere. A 4xx (the request itself is wrong) raises
:class:`EngineRequestError` and is not retried: another engine would refuse it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from integrations.vllm.server import EngineError as ServerError

TOKEN_PREFIX = "token_id:"  # what return_tokens_as_token_ids makes of a token
KEEPALIVE_EXPIRY_S = 2.0  # below the server's keep-alive (see EngineClient.__init__)


class EngineError(ServerError):
    """Something went wrong talking to an engine; the message names the engine and the call
    (one tree with the server launcher's errors)."""


class EngineUnavailable(EngineError):
    """The engine did not answer, or failed (5xx): quarantine it, retry the request elsewhere."""


class EngineRequestError(EngineError):
    """The engine refused the request itself (4xx): no other engine would take it either."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its token ids and the engine's log-probability of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


class EngineClient:
    """Calls to the server at ``url`` (``http://127.0.0.1:PORT``) serving ``model``."""

    def __init__(self, url: str, model: str, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        # Idle connections are dropped before the server drops them: vLLM's server closes a
        # keep-alive connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s), httpx's default
        # expiry is 5 s too, and a request sent on a connection the server is closing at that
        # moment fails with "Server disconnected without sending a response" (a refit failed so,
        # and its engine was quarantined, in a loaded test run).
        self._http = httpx.Client(
            timeout=timeout, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        )

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any] | None, timeout: float | None) -> Any:
        try:
            resp = self._http.post(
                self.url + path, json=body, timeout=self.timeout if timeout is None else timeout
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 500:
            raise EngineUnavailable(f"{self.url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code >= 400:
            raise EngineRequestError(
                f"{self.url}{path}: HTTP {resp.status_code}: {resp.text[:300]}"
            )
        return resp.json() if resp.content else None

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether ``/health`` answers 200 within ``timeout``."""
        try:
            return self._http.get(self.url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def complete(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        seed: int,
        temperature: float = 1.0,
        timeout: float | None = None,
    ) -> Completion:
        """Sample ``max_tokens`` tokens after ``prompt_ids`` with the per-request ``seed`` (the
        same request gives the same tokens on any engine holding the same weights)."""
        body = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": temperature,
            "top_p": 1.0,
            "seed": seed,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        answer = self._post("/v1/completions", body, timeout)
        choice = answer["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = [int(str(t).removeprefix(TOKEN_PREFIX)) for t in lp.get("tokens") or []]
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(tokens) != max_tokens or len(logprobs) != max_tokens:
            raise EngineUnavailable(
                f"{self.url}: asked for {max_tokens} tokens with logprobs, got {len(tokens)} "
                f"tokens and {len(logprobs)} logprobs ({choice.get('finish_reason')})"
            )
        return Completion(tokens, logprobs, choice.get("finish_reason"))

    def collective_rpc(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Run ``method`` of the worker extension on every worker; their results."""
        body: dict[str, Any] = {"method": method, "args": list(args)}
        if timeout is not None:
            body["timeout"] = timeout
        answer = self._post("/collective_rpc", body, None if timeout is None else timeout + 5)
        results = answer.get("results") if isinstance(answer, dict) else answer
        if not isinstance(results, list):
            raise EngineUnavailable(f"{self.url}/collective_rpc {method}: no results in {answer!r}")
        return results

    def reset_prefix_cache(self, timeout: float = 30.0) -> None:
        """Drop the KV blocks cached for prompt prefixes: they were computed with the weights
        before a refit, and a request reusing them would mix two versions."""
        self._post("/reset_prefix_cache", None, timeout)

    def sleep(self, level: int = 1, timeout: float = 60.0) -> None:
        """Free the engine's KV cache (level 1 keeps the weights in host memory)."""
        self._post(f"/sleep?level={int(level)}", None, timeout)

    def wake_up(self, timeout: float = 60.0) -> None:
        """Bring a sleeping engine back."""
        self._post("/wake_up", None, timeout)

    def is_sleeping(self, timeout: float = 5.0) -> bool:
        try:
            resp = self._http.get(self.url + "/is_sleeping", timeout=timeout)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"{self.url}/is_sleeping: {exc}") from exc
        return bool(resp.json().get("is_sleeping"))
