"""A store lease (`leases/…`): which process holds a key's build, until when; and the note `leases --break
--force` leaves for the holder it broke (store/lease.py takes, renews and reads them)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from enginefoundry.schemas.base import Document

DEFAULT_LEASE_TTL_S = 120.0
"""A lease's time to live when none is given (store/lease.py takes EF_LEASE_TTL_S's value)."""


class LeaseRecord(Document):
    """A held lease as stored: the holder (host, pid and its start time, so pid reuse is told apart) and the times
    it was taken, renewed and expires."""

    SCHEMA_NAME: ClassVar[str] = "lease"
    MAX_BYTES: ClassVar[int] = 64 << 10

    key: str = Field(description="store key of the lease object")
    owner: str = Field(description="host:pid:nonce of the holder")
    host: str = ""
    pid: int = 0
    pid_started: str | None = Field(default=None, description="the holder's start time (pid reuse)")
    acquired_at: float = 0.0
    renewed_at: float = 0.0
    expires_at: float
    ttl_s: float = DEFAULT_LEASE_TTL_S


class BrokenLeaseNote(Document):
    """Left beside a lease broken by hand, for its holder to say who broke it."""

    SCHEMA_NAME: ClassVar[str] = "lease-broken-note"
    MAX_BYTES: ClassVar[int] = 64 << 10

    by: str = Field(description="who broke it (`leases --break --force` records the user and host)")
    at: float = Field(description="when, seconds since the epoch")
