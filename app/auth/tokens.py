"""API tokens: creation (shown once), lookup by hash, revocation, and the ingest-path cache."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.auth.audit import record_audit
from app.auth.job_scope import JobScope, parse_job_patterns
from app.core.errors import InvalidInput, NotFound
from app.ingest.validation import ValidBatch
from app.ingest.wire_rules import ID_PATTERN
from app.models import ApiToken, Node, TokenKind, User, utcnow

_NODE_NAME_RE = re.compile(ID_PATTERN)
_PREFIX = {TokenKind.node: "rlgn_", TokenKind.user: "rlgu_"}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token(kind: TokenKind) -> str:
    return _PREFIX[kind] + secrets.token_urlsafe(32)


def validate_node_name(name: str) -> str:
    if not name or len(name) > 128 or not _NODE_NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid node name {name!r}: use 1-128 characters of letters, digits and _.:@/- "
            "(not starting with . : @ / -)"
        )
    return name


def create_node_token(
    session: Session,
    *,
    node: str,
    actor: str,
    description: str = "",
    jobs: list[str] | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token that may ingest for ``node`` (registered if new), for the jobs matching
    the glob patterns ``jobs`` (None: any job; ``app.auth.job_scope``). (row, plaintext)."""
    validate_node_name(node)
    patterns = None if jobs is None else parse_job_patterns(jobs)
    if session.exec(select(Node).where(Node.name == node)).first() is None:
        session.add(Node(name=node))
        session.flush()
        record_audit(session, actor=actor, action="node.register", target=node)
    return _issue(
        session, TokenKind.node, target=f"node:{node}", actor=actor, description=description,
        node_name=node, job_patterns=patterns,
    )  # fmt: skip


def create_user_token(
    session: Session, *, user: User, actor: str, description: str = ""
) -> tuple[ApiToken, str]:
    return _issue(
        session, TokenKind.user, target=f"user:{user.name}", actor=actor, description=description,
        user_id=user.id,
    )  # fmt: skip


def _issue(
    session: Session,
    kind: TokenKind,
    *,
    target: str,
    actor: str,
    description: str,
    node_name: str | None = None,
    user_id: int | None = None,
    job_patterns: list[str] | None = None,
) -> tuple[ApiToken, str]:
    """Store a new token of ``kind`` (only its hash and prefix) and audit it; (row, plaintext)."""
    plaintext = _new_token(kind)
    token = ApiToken(
        kind=kind,
        token_hash=hash_token(plaintext),
        prefix=plaintext[:10],
        node_name=node_name,
        user_id=user_id,
        description=description,
        job_patterns=job_patterns,
    )
    session.add(token)
    session.flush()
    detail: dict[str, object] = {"token_id": token.id, "prefix": token.prefix, "kind": kind.value}
    if job_patterns is not None:
        detail["jobs"] = job_patterns
    record_audit(session, actor=actor, action="token.create", target=target, detail=detail)
    return token, plaintext


def find_active_token(session: Session, plaintext: str) -> ApiToken | None:
    token = session.exec(
        select(ApiToken).where(ApiToken.token_hash == hash_token(plaintext))
    ).first()
    if token is None or token.revoked_at is not None:
        return None
    return token


def revoke_token(session: Session, *, token_id: int, actor: str) -> ApiToken:
    token = session.get(ApiToken, token_id)
    if token is None:
        raise NotFound(f"no token with id {token_id}")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        session.add(token)
        record_audit(
            session,
            actor=actor,
            action="token.revoke",
            target=f"token:{token_id}",
            detail={"prefix": token.prefix, "kind": str(token.kind)},
        )
    return token


def rotate_token(session: Session, *, token_id: int, actor: str) -> tuple[ApiToken, str]:
    """Issue a replacement for an active token (same node or user) and revoke the old one.

    Both happen in the caller's transaction: either the new token exists and the old one is
    revoked, or neither. Returns (new row, new plaintext).
    """
    old = session.get(ApiToken, token_id)
    if old is None:
        raise NotFound(f"no token with id {token_id}")
    if old.revoked_at is not None:
        raise InvalidInput(f"token {token_id} is revoked; issue a new one instead of rotating")
    if old.kind == TokenKind.node:
        assert old.node_name is not None
        new, plaintext = create_node_token(
            session,
            node=old.node_name,
            actor=actor,
            description=old.description,
            jobs=old.job_patterns,  # the replacement keeps the scope
        )
    else:
        user = session.get(User, old.user_id)
        if user is None:
            raise NotFound(f"token {token_id} belongs to no existing user")
        new, plaintext = create_user_token(
            session, user=user, actor=actor, description=old.description
        )
    revoke_token(session, token_id=token_id, actor=actor)
    record_audit(
        session,
        actor=actor,
        action="token.rotate",
        target=f"token:{token_id}",
        detail={"replaced_by": new.id, "prefix": new.prefix, "kind": str(old.kind)},
    )
    return new, plaintext


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node: str
    token_id: int
    job_scope: JobScope | None = None  # None: the token may report any job

    def check_batch(self, batch: ValidBatch) -> None:
        """Ingest asks this of every batch the token sends: 403 for a job outside its scope."""
        if self.job_scope is not None:
            self.job_scope.check_batch(batch)


class NodeTokenCache:
    """Resolves node tokens for the ingest hot path without a database query per request.

    Positive and negative answers are kept ``ttl`` seconds; ``forget`` drops one at once (used
    when a token is revoked through this process's API).
    """

    def __init__(
        self, engine: Engine, *, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.engine = engine
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, tuple[float, NodeIdentity | None, str]] = {}

    def cached(self, plaintext: str) -> tuple[bool, NodeIdentity | None, str]:
        """(hit, identity, why-not) from the cache alone."""
        entry = self._entries.get(hash_token(plaintext))
        if entry is None or entry[0] < self._clock():
            return False, None, ""
        return True, entry[1], entry[2]

    def lookup(self, plaintext: str) -> tuple[NodeIdentity | None, str]:
        """Database lookup (blocking); caches and returns (identity, why-not)."""
        h = hash_token(plaintext)
        with Session(self.engine) as session:
            token = session.exec(select(ApiToken).where(ApiToken.token_hash == h)).first()
            if token is None or token.revoked_at is not None:
                result: tuple[NodeIdentity | None, str] = (None, "unknown or revoked token")
            elif token.kind != TokenKind.node or token.node_name is None:
                result = (None, "this is a user token; ingest needs a node token")
            else:
                assert token.id is not None
                scope = JobScope.of(token.job_patterns)
                result = (NodeIdentity(token.node_name, token.id, scope), "")
        if len(self._entries) > 100_000:
            self._entries.clear()
        self._entries[h] = (self._clock() + self.ttl, result[0], result[1])
        return result

    def forget_all(self) -> None:
        self._entries.clear()
