"""Errors the services raise; routes map them to HTTP statuses, the CLI to one-line messages."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error a service raises on purpose; the message is safe to show."""

    status_code = 400
    #: Raised before the request's body was read: the answer closes the connection
    #: (``Connection: close``), or the server would still receive and parse the unread body to
    #: find the keep-alive connection's next request (RFC 9112, 9.6), on the event loop, for
    #: a request it refused so as not to spend that time.
    closes_connection = False


class InvalidInput(ServiceError):
    status_code = 422


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class NotAuthenticated(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class PayloadTooLarge(ServiceError):
    status_code = 413


class TooManyRequests(ServiceError):
    """Refused by a rate limit; ``retry_after`` is whole seconds until a try can succeed."""

    status_code = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(ServiceError):
    status_code = 503
