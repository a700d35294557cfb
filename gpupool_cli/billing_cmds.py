"""``gpupool billing|price|adjust|invoice`` and ``account set``: the operator's billing commands."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from billing import passes
from billing.alerts import MAX_FORECAST_HOURS, check_thresholds, set_alert_settings
from billing.budgets import balance
from billing.calendar import check_period, period_of
from billing.enforcement import cancel_exhausted, push_budgets
from billing.invoice import invoice_filename, write_invoice
from billing.member_limits import push_member_limits
from billing.money import MoneyError, format_nanos, parse_nanos
from billing.price_book import ANY_GPU_TYPE, NORMAL_TIER, SPOT_TIER
from billing.prices import price_table, set_price
from billing.sacct import XDMOD_FIELDS
from billing.storage import STORAGE_PRICE, set_storage_price, storage_price_table
from gpupool import audit, db
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.db.locks import BILLING_RUN, alone
from gpupool.errors import GpupoolError, NotFound, ValidationFailed
from gpupool.models import Account, Adjustment
from gpupool.slurm.client import SlurmClient
from gpupool_cli.output_cmds import prune
from gpupool_cli.storage_cmds import check_growth, set_quota_note, storage_size

PRICE_TIERS = (NORMAL_TIER, SPOT_TIER)
_GPU_TYPE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def parse_utc(text: str) -> dt.datetime:
    """``2026-12-01``, ``2026-12-01T06:00``, ``...Z`` or with an offset; no zone means UTC."""
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date or time such as 2026-12-01T00:00:00Z") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def _money(value: str) -> int:
    try:
        return parse_nanos(value)
    except MoneyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _optional_money(value: str) -> int | None:
    return None if value.strip().lower() == "none" else _money(value)


def period_argument(value: str) -> str:
    """argparse type of a ``--period``: a month YYYY-MM, checked as the API checks it."""
    try:
        return check_period(value)
    except GpupoolError as exc:
        raise argparse.ArgumentTypeError(exc.message) from exc


def _gpu_type(value: str) -> str:
    if value != ANY_GPU_TYPE and not (value and set(value) <= _GPU_TYPE_CHARS and len(value) <= 64):
        raise argparse.ArgumentTypeError(f"{value!r} is not a GPU type such as rtx4090 (or * for every other type)")
    return value


def _billing_sessions(settings: Settings) -> sessionmaker:
    """The pass's connection: billing_database_url, whose role may add ledger rows but change none."""
    return db.migrated_sessions(settings.billing_url())


def _describe(report: passes.PassReport) -> str:
    return (
        f"pass {report.pass_id}: {report.sacct_rows} sacct rows, {report.runs} GPU runs, "
        f"{report.ledger_rows} ledger rows, {report.gpu_seconds} GPU-seconds, "
        f"{format_nanos(report.amount_nanos)} billed, {report.credits} credits, "
        f"{report.storage_charges} storage charges ({format_nanos(report.storage_amount_nanos)}); raw output {report.archive_path}"
    )


def cmd_billing_run(settings: Settings, args: argparse.Namespace) -> int:
    sessions = _billing_sessions(settings)
    if args.since is not None or args.until is not None:
        return _billing_run(settings, sessions, args)  # an operator's backfill: each window waits on the pass lock
    # The timer's run, on every API host: once per cluster (gpupool.db.locks).
    with sessions() as lock_session, alone(lock_session, BILLING_RUN) as first:
        if not first:
            print("another billing run holds the lock (this host or another): this one did nothing")
            return 0
        return _billing_run(settings, sessions, args)


def _billing_run(settings: Settings, sessions: sessionmaker, args: argparse.Namespace) -> int:
    slurm = SlurmClient(settings)
    try:
        if args.since is None and args.until is None:
            report = passes.run_pass(sessions, slurm, settings)
            print(_describe(report))
            for reason in report.refused:
                # Rows a tenant's free text may have forged: left unbilled, for the operator to look at.
                print(f"gpupool: warning: sacct row not billed: {reason}", file=sys.stderr)
        else:
            since = args.since or parse_utc("1970-01-01")
            until = args.until or db.utcnow().replace(microsecond=0)
            if since >= until:
                print("gpupool: error: --since must be before --until", file=sys.stderr)
                return 2
            total = passes.backfill_windows(settings, since, until)
            progress = _progress(total)
            reports = passes.backfill(sessions, slurm, settings, since, until, on_window=progress)
            progress(None)
            rows = sum(report.ledger_rows for report in reports)
            print(f"backfilled {utc_text(since)} to {utc_text(until)} in {len(reports)} passes: {rows} ledger rows")
    except GpupoolError as exc:
        print(
            f"gpupool: error: billing pass failed; nothing was written and the mark did not move: {exc.message}",
            file=sys.stderr,
        )
        return 1
    status = max(_push_budgets(sessions, slurm), _push_member_limits(sessions, slurm))
    if settings.job_output_retention_days > 0 and prune(settings, sessions).failed:
        status = max(status, 1)
    if settings.billing_cancel_exhausted:
        for account in cancel_exhausted(sessions, slurm):
            print(f"account {account} has no budget left: its jobs were cancelled")
    return status


def _push_budgets(sessions: sessionmaker, slurm: SlurmClient, accounts: list[str] | None = None) -> int:
    """Each account's money as its Slurm budget (GrpTRESMins=gres/gpu), printing what changed; 1 if Slurm was out of reach."""
    try:
        changed = push_budgets(sessions, slurm, accounts=accounts)
    except GpupoolError as exc:
        print(f"gpupool: error: could not bring the Slurm budgets up to date: {exc.message}", file=sys.stderr)
        return 1
    for account, minutes in changed.items():
        shown = "no limit" if minutes is None else f"{minutes} GPU-minutes"
        print(f"account {account}: Slurm budget set to {shown}")
    return 0


def _push_member_limits(sessions: sessionmaker, slurm: SlurmClient) -> int:
    """Each member user's GPU limit and what is left of their monthly limit as Slurm limits; 1 if Slurm was out of reach."""
    try:
        with sessions() as session:
            changed = push_member_limits(session, slurm, slurm.settings.calendar_clock()())
    except GpupoolError as exc:
        print(f"gpupool: error: could not bring the members' Slurm limits up to date: {exc.message}", file=sys.stderr)
        return 1
    for (account, user), limits in changed.items():
        gpus = "no GPU limit" if limits.gpus is None else f"{limits.gpus} GPU(s)"
        minutes = "no budget" if limits.gpu_minutes is None else f"{limits.gpu_minutes} GPU-minutes"
        print(f"account {account}: member user {user} limited to {gpus}, {minutes}")
    return 0


def _progress(total: int) -> passes.ProgressHook:
    """A progress bar on a terminal; nothing when stderr is a file or a pipe (cron)."""
    if not sys.stderr.isatty():
        return lambda _report: None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="window", file=sys.stderr)

    def advance(report: passes.PassReport | None) -> None:
        if report is None:
            bar.close()
        else:
            bar.set_postfix(rows=report.ledger_rows, refresh=False)
            bar.update(1)

    return advance


def _field_names(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(","))
    if not all(names) or len(set(map(str.lower, names))) != len(names):
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of distinct sacct field names")
    return names


def cmd_billing_replay(settings: Settings, args: argparse.Namespace) -> int:
    if args.format == "xdmod" and args.fields is not None:
        print("gpupool: error: --format xdmod names the fields itself; give --fields only for other header-less dumps", file=sys.stderr)
        return 2
    fields = XDMOD_FIELDS if args.format == "xdmod" else args.fields
    sessions = _billing_sessions(settings)
    report = passes.replay(
        sessions, settings, Path(args.file), delimiter=args.delimiter, cluster=args.cluster, fields=fields
    )
    print(_describe(report))
    return 0


def cmd_price_set(settings: Settings, args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    effective = args.effective_from or db.utcnow().replace(microsecond=0)
    storage = args.gpu_type == STORAGE_PRICE
    if storage and args.tier != NORMAL_TIER:
        print("gpupool: error: storage has one price, without tiers", file=sys.stderr)
        return 2
    with sessions() as session, session.begin():
        if storage:
            set_storage_price(session, args.price, effective)
        else:
            set_price(session, args.gpu_type, args.price, effective, args.tier)
        audit.record(
            session, audit.operator_actor(), audit.PRICE_SET, account=None, target=args.gpu_type, now=db.utcnow(),
            details={"price": format_nanos(args.price), "tier": args.tier, "from": utc_text(effective)},
        )
    unit = "per GiB-month (a GiB kept 30 days)" if storage else "per GPU-second"
    print(f"{args.gpu_type} ({args.tier}): {format_nanos(args.price)} {settings.currency} {unit} from {utc_text(effective)}")
    return 0


def cmd_price_list(settings: Settings, _args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    with sessions() as session:
        for gpu_type, start, price, tier in price_table(session):
            print(f"{gpu_type}\t{start}\t{price}\t{tier}")
        for start, price in storage_price_table(session):
            print(f"{STORAGE_PRICE}\t{start}\t{price}\tper-GiB-month")
    return 0


def cmd_adjust(settings: Settings, args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    period = args.period or period_of(settings.calendar_clock()())
    with sessions() as session, session.begin():
        if session.get(Account, args.account) is None:
            raise NotFound(f"no account {args.account!r}; create it with `gpupool account create`")
        adjustment = Adjustment(
            account=args.account,
            period=period,
            amount_nanos=args.amount,
            reason=args.reason,
            kind="manual",
            created_by=args.by,
            created_at=db.utcnow(),
        )
        session.add(adjustment)
        session.flush()
        adjustment_id = adjustment.id
        audit.record(
            session, audit.operator_actor(), audit.ADJUSTMENT_ADD, account=args.account, target=str(adjustment_id),
            details={"amount": format_nanos(args.amount), "period": period, "reason": args.reason, "by": args.by},
            now=db.utcnow(),
        )
    print(f"adjustment {adjustment_id}: {format_nanos(args.amount)} {settings.currency} on {args.account}'s {period} invoice")
    return 0


def cmd_invoice(settings: Settings, args: argparse.Namespace) -> int:
    engine = db.migrated_engine(settings.database_url)
    sessions = db.make_session_factory(engine)
    with sessions() as session:
        if session.get(Account, args.account) is None:
            raise NotFound(f"no account {args.account!r}")
    with engine.connect() as connection:
        if args.output == "-":
            write_invoice(connection, args.account, args.period, settings.currency, sys.stdout)
            return 0
        output = Path(args.output or invoice_filename(args.account, args.period))
        partial = output.with_name(output.name + ".partial")
        # newline="": the CSV writer's CRLF line ends pass through untouched.
        with open(partial, "w", newline="", encoding="utf-8") as handle:
            write_invoice(connection, args.account, args.period, settings.currency, handle)
        partial.replace(output)
    print(f"wrote {output}")
    return 0


def cmd_account_set(settings: Settings, args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    now = settings.calendar_clock()()
    with sessions() as session, session.begin():
        account = session.get(Account, args.name)
        if account is None:
            raise NotFound(f"no account {args.name!r}; create it with `gpupool account create {args.name}`")
        if args.credit is not _UNSET:
            account.prepaid_credit_nanos = args.credit
        if args.monthly_limit is not _UNSET:
            account.monthly_limit_nanos = args.monthly_limit
        if args.storage_quota is not None:
            check_growth(settings, args.name, args.storage_quota)
            account.storage_quota_bytes = args.storage_quota
        if args.alert_thresholds is not None or args.alert_email is not None or args.forecast_hours is not _UNSET:
            try:
                set_alert_settings(
                    session, args.name, args.alert_thresholds, args.alert_email, now,
                    **({} if args.forecast_hours is _UNSET else {"forecast_hours": args.forecast_hours}),
                )
            except ValueError as exc:
                raise ValidationFailed(str(exc)) from exc
        session.flush()
        audit.record(session, audit.operator_actor(), audit.ACCOUNT_SET, account=args.name, now=now, details=_account_set_details(args))
        summary = balance(session, args.name, now).as_json()
    shown = ", ".join(f"{key}={value if value is not None else '-'}" for key, value in summary.items())
    print(f"account {args.name}: {shown} ({settings.currency})")
    if args.storage_quota is not None and settings.storage_root:
        print(set_quota_note(settings, args.name, args.storage_quota))
    # At once, not at the next billing pass: a direct sbatch must not outrun the new budget.
    return _push_budgets(sessions, SlurmClient(settings), accounts=[args.name])


_UNSET = object()


def _account_set_details(args: argparse.Namespace) -> dict[str, object]:
    """The flags given, as the audit log keeps them."""
    given: dict[str, object] = {}
    for name in ("credit", "monthly_limit"):
        value = getattr(args, name)
        if value is not _UNSET:
            given[name] = None if value is None else format_nanos(value)
    if args.alert_thresholds is not None:
        given["alert_thresholds"] = list(args.alert_thresholds)
    if args.alert_email is not None:
        given["alert_email"] = args.alert_email
    if args.forecast_hours is not _UNSET:
        given["forecast_hours"] = args.forecast_hours
    if args.storage_quota is not None:
        given["storage_quota_bytes"] = args.storage_quota
    return given


def _thresholds(text: str) -> tuple[int, ...]:
    try:
        return check_thresholds(int(part) for part in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _forecast_hours(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        hours = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"hours must be a whole number or none, not {text!r}") from None
    if not 1 <= hours <= MAX_FORECAST_HOURS:
        raise argparse.ArgumentTypeError(f"hours must be 1 to {MAX_FORECAST_HOURS}, or none")
    return hours


def add_billing_parsers(sub: argparse._SubParsersAction, account_sub: argparse._SubParsersAction) -> None:
    billing = sub.add_parser("billing", help="the billing worker").add_subparsers(dest="billing_command", required=True)
    run = billing.add_parser("run", help="one billing pass (cron: every 5 minutes), or a backfill with --since/--until")
    run.add_argument("--since", type=parse_utc, help="backfill from this time (ISO 8601, UTC unless given)")
    run.add_argument("--until", type=parse_utc, help="backfill up to this time (default: now)")
    run.set_defaults(handler=cmd_billing_run)
    replay = billing.add_parser(
        "replay", help="bill a saved sacct --parsable2 dump (plain or .gz), ours, XDMoD's or any other; idempotent"
    )
    replay.add_argument("file")
    replay.add_argument(
        "--format",
        choices=("sacct", "xdmod"),
        default="sacct",
        help="sacct: a header line names the fields (default); xdmod: Open XDMoD's header-less 26-field export",
    )
    replay.add_argument(
        "--fields", type=_field_names, help="the fields of a header-less dump, in order, e.g. jobidraw,account,state,..."
    )
    replay.add_argument("--delimiter", help="field delimiter (default: read from the header line, or | without one)")
    replay.add_argument("--cluster", help="cluster name, for output without a Cluster column")
    replay.set_defaults(handler=cmd_billing_replay)

    price = sub.add_parser("price", help="GPU and storage prices").add_subparsers(dest="price_command", required=True)
    price_set = price.add_parser("set", help="price per GPU-second of a GPU type, or per GiB-month of storage, from a date on")
    price_set.add_argument(
        "gpu_type", type=_gpu_type, help=f"e.g. rtx4090, * for every type without a price, or {STORAGE_PRICE} for account storage"
    )
    price_set.add_argument("price", type=_money, help="per GPU-second, e.g. 0.00012; for storage per GiB-month, e.g. 0.07")
    price_set.add_argument("--from", dest="effective_from", type=parse_utc, help="effective from (default: now)")
    price_set.add_argument(
        "--tier",
        choices=PRICE_TIERS,
        default=NORMAL_TIER,
        help="normal: full price; spot: preemptible jobs (Slurm QOS spot); default normal",
    )
    price_set.set_defaults(handler=cmd_price_set)
    price.add_parser("list", help="every price and when it applies").set_defaults(handler=cmd_price_list)

    adjust = sub.add_parser("adjust", help="record a credit (negative) or charge on an invoice")
    adjust.add_argument("--account", required=True)
    adjust.add_argument("--amount", required=True, type=_money, help="e.g. -12.50 for a credit")
    adjust.add_argument("--reason", required=True)
    adjust.add_argument("--period", type=period_argument, help="invoice month YYYY-MM (default: this month)")
    adjust.add_argument("--by", default="operator", help="who made it, for the record")
    adjust.set_defaults(handler=cmd_adjust)

    invoice = sub.add_parser("invoice", help="write an account's invoice for a month as CSV")
    invoice.add_argument("--account", required=True)
    invoice.add_argument("--period", required=True, type=period_argument, help="YYYY-MM")
    invoice.add_argument("-o", "--output", help="file to write (default: gpupool-invoice-ACCOUNT-PERIOD.csv; - for stdout)")
    invoice.set_defaults(handler=cmd_invoice)

    account_set = account_sub.add_parser("set", help="budgets (prepaid credit, monthly spend limit), spend alerts, storage quota")
    account_set.add_argument("name")
    account_set.add_argument("--credit", type=_optional_money, default=_UNSET, help="total prepaid credit, or none")
    account_set.add_argument("--monthly-limit", type=_optional_money, default=_UNSET, help="spend cap per UTC month, or none")
    account_set.add_argument(
        "--alert-thresholds", type=_thresholds, help="spend alerts at these percentages of the credit / limit, e.g. 50,80,100"
    )
    account_set.add_argument("--alert-email", help="email spend alerts here (needs smtp_host); 'none' to stop")
    account_set.add_argument(
        "--forecast-hours", type=_forecast_hours, default=_UNSET,
        help="alert (budget.forecast) when the last 24 hours' rate empties a budget within this many hours; 'none': off",
    )
    account_set.add_argument(
        "--storage-quota", type=storage_size, default=None, metavar="SIZE",
        help="size of the account's storage, e.g. 1T; it only grows (as root the volume grows at once)",
    )
    account_set.set_defaults(handler=cmd_account_set)
