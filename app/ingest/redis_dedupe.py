"""Cross-replica ingest dedupe: one atomic claim per (node, agent, seq) in Redis.

With several server replicas behind a load balancer, an agent's retry can reach another replica
than the first delivery. Each replica still keeps its in-memory ``DedupeWindow`` (loaded from the
database at start), and in shared mode a batch is applied only if BOTH say it is new:

* the local window (which holds every seq this replica applied, and after a reload every seq the
  database holds as committed by any replica), and
* an atomic claim in Redis: a Lua script keeps, per agent, the same anti-replay window as
  ``DedupeWindow`` (the highest seq plus one hash field per seq of the 63 below it) and marks the
  seq in one step, so two replicas can never both claim it.

If Redis loses its data (restart without persistence, failover, flush), the claims made before are
gone. Every claim therefore also checks an epoch key that a replica sets when it first sees an
empty Redis; a claim under a changed epoch answers "reload" and the replica merges the windows the
database holds (every acknowledged batch of every replica is there: the cursor upsert merges
windows instead of overwriting them) into its local ones before claiming again.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis.asyncio as aioredis
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from app.core.db import table_of
from app.ingest.dedupe import WINDOW, DedupeWindow
from app.models import IngestCursor

# KEYS: epoch, agent hash. ARGV: epoch, seq, window, ttl, now_ms, steal_before_ms (0: never).
# A claim's field holds the time it was made; a claim older than steal_before_ms may be taken
# over (the caller has checked that the database does not hold the seq, i.e. the replica that
# claimed it died or gave up before committing).
_CLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local seq = tonumber(ARGV[2])
local w = tonumber(ARGV[3])
local field = 's' .. ARGV[2]
local high = tonumber(redis.call('HGET', KEYS[2], 'high') or '-1')
local claimed = 0
if seq > high then
  local lo = math.max(high - w + 1, 0)
  for s = lo, math.min(high, seq - w) do redis.call('HDEL', KEYS[2], 's' .. s) end
  redis.call('HSET', KEYS[2], 'high', ARGV[2], field, ARGV[5])
  claimed = 1
elseif high - seq < w then
  local at = redis.call('HGET', KEYS[2], field)
  if not at or tonumber(at) < tonumber(ARGV[6]) then
    redis.call('HSET', KEYS[2], field, ARGV[5])
    claimed = 1
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[4])
return claimed
"""

NEEDS_RELOAD = -1


class RedisDedupe:
    """Atomic (node, agent, seq) claims shared by all replicas of one deployment."""

    def __init__(self, *, redis_url: str, prefix: str, ttl_seconds: int, timeout: float) -> None:
        self._redis: Any = aioredis.Redis.from_url(
            redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._epoch_key = f"{prefix}:dedupe:epoch"
        self._prefix = f"{prefix}:dedupe"
        self._ttl = max(1, int(ttl_seconds))
        self._script: Any = self._redis.register_script(_CLAIM)
        self.epoch: str | None = None

    async def ensure_epoch(self) -> str:
        """The current epoch; a fresh one is set when Redis has none (empty or restarted)."""
        mine = uuid.uuid4().hex
        if await self._redis.set(self._epoch_key, mine, nx=True):
            self.epoch = mine
        else:
            current = await self._redis.get(self._epoch_key)
            self.epoch = current.decode() if current is not None else mine
        return self.epoch

    async def claim(
        self, node: str, agent: str, seq: int, *, steal_older_than: float | None = None
    ) -> int:
        """1 new (now claimed), 0 already claimed, NEEDS_RELOAD when the epoch changed.

        With ``steal_older_than`` (seconds), a claim made longer ago than that is taken over.
        """
        if self.epoch is None:
            return NEEDS_RELOAD
        now_ms = int(time.time() * 1000)
        steal_before = 0 if steal_older_than is None else now_ms - int(steal_older_than * 1000)
        key = f"{self._prefix}:{len(node)}:{node}:{agent}"
        return int(
            await self._script(
                keys=[self._epoch_key, key],
                args=[self.epoch, seq, WINDOW, self._ttl, now_ms, steal_before],
            )
        )

    async def close(self) -> None:
        await self._redis.aclose()


def merge_windows(a: DedupeWindow, b: DedupeWindow) -> DedupeWindow:
    """The union of two windows of one agent (every seq either has seen)."""
    if a.high_seq < b.high_seq:
        a, b = b, a
    shift = a.high_seq - b.high_seq
    moved = (b.window_mask << shift) if shift < WINDOW else 0
    return DedupeWindow(a.high_seq, (a.window_mask | moved) & ((1 << WINDOW) - 1))


def load_cursor(engine: Engine, node: str, agent: str) -> DedupeWindow | None:
    """The agent's window as the database holds it (what is committed, by any replica)."""
    t = table_of(IngestCursor)
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(t.c.high_seq, t.c.window_mask).where(
                t.c.node_name == node, t.c.agent_id == agent
            )
        ).first()
    return None if row is None else DedupeWindow(row[0], row[1])
