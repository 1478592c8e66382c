"""Who may change the proxy's state, and how much memory requests may hold. No I/O here.

The admin token guards every call that changes what the replicas serve or which replicas
there are; the body budget bounds the bytes held by all requests in flight together, so many
large bodies at once get 503 instead of growing the process without limit.
"""

import hmac
import os


class AdminGuard:
    """`Authorization: Bearer <token>` check, in constant time; open when no token is set."""

    def __init__(self, token: str | None):
        self._expected = token.encode("utf-8") if token else None

    @classmethod
    def from_env(cls, variable: str | None) -> "AdminGuard":
        if not variable:
            return cls(None)
        token = os.environ.get(variable, "").strip()
        if not token:
            raise ValueError(f"--admin-token-env {variable}: that environment variable is empty or unset")
        return cls(token)

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, authorization: str | None) -> bool:
        if self._expected is None:
            return True
        if not authorization:
            return False
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # compare_digest takes as long whatever the first differing byte is
        return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), self._expected)


class BodyBudget:
    """Bytes of request bodies held at once, over all requests, capped at `limit`."""

    __slots__ = ("limit", "held", "peak", "refused")

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.refused = 0

    def fits(self, size: int) -> bool:
        """Whether `size` more bytes would fit now (nothing taken, nothing counted)."""
        return self.held + size <= self.limit

    def reserve(self, size: int) -> bool:
        """Take `size` bytes if they fit (a body alone larger than the limit never fits)."""
        if self.held + size > self.limit:
            self.refused += 1
            return False
        self.held += size
        if self.held > self.peak:
            self.peak = self.held
        return True

    def release(self, size: int) -> None:
        self.held -= size


def over_budget_message(limit: int) -> str:
    """The 503 message when a request's body does not fit in the budget."""
    return (
        f"the proxy holds its limit of request bytes in flight ({limit} bytes, --max-inflight-body-bytes); "
        "retry shortly"
    )
