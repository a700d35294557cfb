"""The billing ledger, prices, adjustments and the worker's bookkeeping.

Money columns hold integer nano-units (1e-9 of the currency), so sums are
exact on every backend; ``billing.money`` converts at the edges.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class BillingState(Base):
    """One row. Every pass updates it first: that write is the billing lock."""

    __tablename__ = "billing_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # End of the last sacct window billed; the next pass starts before it by the overlap.
    mark: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    locked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class BillingPass(Base):
    """What one pass read and wrote, for audits."""

    __tablename__ = "billing_passes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # run | replay
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    window_start: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    window_end: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    source: Mapped[str] = mapped_column(Text)
    source_sha256: Mapped[str] = mapped_column(String(64))
    archive_path: Mapped[str | None] = mapped_column(Text)
    sacct_rows: Mapped[int] = mapped_column(Integer)
    ledger_rows: Mapped[int] = mapped_column(Integer)
    adjustment_rows: Mapped[int] = mapped_column(Integer)


class Price(Base):
    """Price of one GPU-second of ``gpu_type`` in ``tier`` from ``effective_from`` until the next row."""

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("tier", "gpu_type", "effective_from", name="uq_prices_tier_type_from"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # "*" prices every type that has no price of its own.
    gpu_type: Mapped[str] = mapped_column(String(64))
    unit_price_nanos: Mapped[int] = mapped_column(BigInteger)
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # The Slurm QOS whose runs pay this price: normal (full price) or spot (preemptible).
    tier: Mapped[str] = mapped_column(String(32), default="normal", server_default="normal")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class LedgerEntry(Base):
    """GPU-seconds of one job run, of one GPU type, in one interval. Never updated or deleted.

    Correction rows carry negative seconds, GPU-seconds and amount.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = (
        # A run is (cluster, job id, start): requeues restart with a new start,
        # and a wrapped-around job id never shares one with its predecessor.
        # Job id first: each pass looks up what is billed by a range of job ids.
        UniqueConstraint(
            "job_id_raw", "cluster", "run_start", "gpu_type", "interval_from", "correction", name="uq_ledger_run_interval"
        ),
        # Invoices group and order by exactly these columns: an index scan with no sort.
        Index(
            "ix_ledger_invoice_tier",
            "account", "period", "cluster", "job_id_raw", "run_start", "gpu_type", "unit_price_nanos", "tier",
        ),
        Index("ix_ledger_gpupool_job", "gpupool_job_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pass_id: Mapped[int] = mapped_column(ForeignKey("billing_passes.id"))
    account: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(64))
    slurm_job_id: Mapped[str] = mapped_column(String(64))  # as sacct shows it: 12, 12_3, 12+1
    job_id_raw: Mapped[int] = mapped_column(BigInteger)
    run_start: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    gpupool_job_id: Mapped[str | None] = mapped_column(String(36))
    job_name: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(32))  # the run's state when this row was billed
    gpu_type: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    period: Mapped[str] = mapped_column(String(7))  # YYYY-MM, UTC
    interval_from: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    interval_to: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    seconds: Mapped[int] = mapped_column(BigInteger)
    gpu_seconds: Mapped[int] = mapped_column(BigInteger)
    unit_price_nanos: Mapped[int] = mapped_column(BigInteger)
    amount_nanos: Mapped[int] = mapped_column(BigInteger)
    # Takes back seconds billed to a running job past its real end (billing.meter).
    correction: Mapped[bool] = mapped_column(default=False)
    # Written from Slurm's finished record: the run takes no rows after this one.
    final: Mapped[bool] = mapped_column(default=False)
    # The member's own Unix user that ran the job (gpupool.models.MemberIdentity); None: the
    # account's user. Counts a member's direct sbatch in their monthly spend (migration 0027).
    member_user: Mapped[str | None] = mapped_column(String(32))
    # The price tier of unit_price_nanos: the QOS Slurm ran the run under (billing.meter).
    tier: Mapped[str] = mapped_column(String(32), default="normal", server_default="normal")


class Adjustment(Base):
    """A credit (negative) or charge on an account's invoice for one period. Never changed or deleted (migration 0024)."""

    __tablename__ = "adjustments"
    __table_args__ = (Index("ix_adjustments_account_period", "account", "period"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account: Mapped[str] = mapped_column(String(64))
    period: Mapped[str] = mapped_column(String(7))
    amount_nanos: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(32))  # manual | failed_node_credit
    # Automatic adjustments carry a key, so a rerun can never credit twice.
    source_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class AccountSpend(Base):
    """What an account spent in one period: its ledger amounts and its adjustments, each summed, exactly.

    The database keeps these totals itself: triggers on INSERT into ``ledger_entries``
    and ``adjustments`` (both append-only) add each new row's amount, in the inserting
    transaction, however the row came (ORM, executemany, COPY). gpupool never writes
    this table; budgets read it instead of summing an account's whole history.
    """

    __tablename__ = "account_spend"

    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    period: Mapped[str] = mapped_column(String(7), primary_key=True)  # YYYY-MM, UTC
    ledger_nanos: Mapped[int] = mapped_column(BigInteger)
    adjustment_nanos: Mapped[int] = mapped_column(BigInteger)


class MemberSpend(Base):
    """What one member's jobs were billed in one period: the ledger amounts of the API jobs they submitted, summed.

    Kept by the database like ``AccountSpend`` (migration 0025): a trigger on INSERT
    into ``ledger_entries`` adds each row that names an API job (``gpupool_job_id``) to
    that job's owner in the row's account and period, and (migration 0027) each row of
    a job a member's own user ran around the API (``member_user``) to that member.
    Adjustments are the account's, never a member's. A member's monthly limit reads one row here instead of
    summing the month's ledger rows of their jobs.
    """

    __tablename__ = "member_spend"

    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    period: Mapped[str] = mapped_column(String(7), primary_key=True)  # YYYY-MM, UTC
    ledger_nanos: Mapped[int] = mapped_column(BigInteger)


class StoragePrice(Base):
    """The price of a GiB of account storage kept for a month (30 days), from ``effective_from`` on."""

    __tablename__ = "storage_prices"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime, unique=True)
    nanos_per_gib_month: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class StorageSample(Base):
    """Bytes an account's storage held when a billing pass looked (its filesystem's own count)."""

    __tablename__ = "storage_samples"

    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    sampled_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)
    stored_bytes: Mapped[int] = mapped_column(BigInteger)


class StorageCharge(Base):
    """Storage kept over one interval (within one UTC hour): the bytes of the sample that began it,
    for the interval's seconds, at the price in effect at its start. Never updated or deleted."""

    __tablename__ = "storage_charges"
    __table_args__ = (
        UniqueConstraint("account", "interval_from", name="uq_storage_charge_interval"),
        Index("ix_storage_charges_invoice", "account", "period", "nanos_per_gib_month"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pass_id: Mapped[int] = mapped_column(ForeignKey("billing_passes.id"))
    account: Mapped[str] = mapped_column(String(64))
    period: Mapped[str] = mapped_column(String(7))  # YYYY-MM, UTC
    interval_from: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    interval_to: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    stored_bytes: Mapped[int] = mapped_column(BigInteger)
    byte_seconds: Mapped[int] = mapped_column(BigInteger)
    nanos_per_gib_month: Mapped[int] = mapped_column(BigInteger)
    amount_nanos: Mapped[int] = mapped_column(BigInteger)
