"""Reading sacct's accounting output into job runs: pure, tested on literal strings.

A billing pass asks for exactly ``PASS_FIELDS``; replays accept any
``sacct --parsable2`` output whose header names at least ``REQUIRED_FIELDS``
and ``ElapsedRaw`` or ``Elapsed``, or header-less output whose fields are named
by the caller (``XDMOD_FIELDS`` for Open XDMoD's export). Field names are
sacct's, in any case. The field parsers are ``gpupool.slurm.parse``'s, whose
docstring maps every parser of Slurm's text.

``JobName`` is a tenant's free text, printed as it is, so it must be the last
column: a delimiter in a name then stays in the name. A newline in a name
starts a line that is not a row of its own, and after it the tenant may have
written anything, a whole row billing another account included. So:

- under the billing pass's delimiter (``unpredictable_delimiter``, new for each
  pass and kept in its archive), which no name written before the pass holds,
  a line of fewer fields continues the name before it, and a line of the
  header's width can only be a row;
- under any other delimiter (``|``: every other site's dump, Open XDMoD's) a
  line that is not a whole row refuses the file (``DumpRefused``, with its line
  number), and so does a row billing an account of gpupool's own tenants
  (``Tenancy``): a line of the right width there may be the end of the
  previous job's name, and no reading of the text alone can tell. The
  history of this cluster is billed by ``gpupool billing run --since/--until``,
  which asks sacct itself;
- under either, each row's User must be its Account's tenant user or one of
  its members' own users, and such a user runs jobs under its own account only
  (``Tenancy.mismatch``). A
  replay refuses the file on the first row that breaks it; a billing pass,
  reading sacct itself, leaves that row unbilled and says so (``RunReader.refused``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from gpupool.gpu_health.failure import GpuFailure, parse_comment
from gpupool.slurm.parse import (
    ParseError,
    base_state,
    expand_hostlist,
    gpus_by_type,
    is_unpredictable,
    numbered_rows,
    parse_elapsed,
    parse_time,
    read_header,
)

SACCT_FIELDS = (
    "Cluster",
    "JobIDRaw",
    "JobID",
    "Account",
    "User",
    "State",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "JobName",
)
# What a billing pass asks sacct for: the above, each run's QOS, which prices it (billing.meter),
# and its nodes, which tie a run that failed just before a GPU drain to that drain (billing.credits).
# Output without a QOS column (older dumps) bills at the normal tier.
PASS_FIELDS = (*SACCT_FIELDS[:-1], "QOS", "NodeList", SACCT_FIELDS[-1])
REQUIRED_FIELDS = ("JobIDRaw", "Account", "User", "State", "Start", "AllocTRES")
# Exact seconds when sacct printed them; otherwise [D-]HH:MM:SS, as older dumps have it.
ELAPSED_FIELDS = ("ElapsedRaw", "Elapsed")
# Open XDMoD's documented shredder export:
# TZ=UTC sacct --allusers --parsable2 --noheader --allocations --duplicates --format <these>
XDMOD_FIELDS = (
    "jobid", "jobidraw", "cluster", "partition", "qos", "account", "group", "gid", "user", "uid",
    "submit", "eligible", "start", "end", "elapsed", "exitcode", "state", "nnodes", "ncpus",
    "reqcpus", "reqmem", "reqtres", "alloctres", "timelimit", "nodelist", "jobname",
)
# sacct's own spelling of the names billing reads; sacct accepts any case in --format.
_CANONICAL = {
    name.lower(): name
    for name in (*PASS_FIELDS, "Elapsed", "NodeList", "Partition", "Eligible", "ExitCode", "NNodes", "ReqTRES")
}
# Columns sacct fills with what a job's submitter wrote (lower case): at most one, last.
_FREE_TEXT = frozenset({
    "jobname", "comment", "admincomment", "systemcomment", "workdir", "submitline", "wckey", "constraints",
    "extra", "container",
})
# States whose runs end with an automatic credit when the operator asks for it.
FAILED_NODE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
_UNFINISHED = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "STAGE_OUT"})


# Not frozen: a frozen dataclass's __init__ costs several times more. Keywords only: twelve fields, most of
# them strings or times, that a positional call could swap unseen.
@dataclass(slots=True, kw_only=True)
class JobRun:
    """One allocation of one job: a requeued job has one run per start."""

    cluster: str
    job_id_raw: int
    job_id: str
    account: str
    state: str
    start: dt.datetime
    end: dt.datetime | None
    elapsed_s: int
    gpus: dict[str, int]
    name: str
    # sacct's own text of start and end, reused when writing rows (see billing.ledger_writer).
    start_text: str = field(default="", compare=False, repr=False)
    end_text: str = field(default="", compare=False, repr=False)
    # The QOS Slurm ran this run under, lower case: its price tier (billing.price_book.PriceBook).
    qos: str = "normal"
    # The member's own user that ran it (Tenancy.members), whose monthly spend it counts in even
    # when the member submitted it around the API; None: the account's user, or no gpupool tenant.
    member_user: str | None = None
    # The nodes the run was allocated (sacct's NodeList, expanded); empty when the output has no such column.
    nodes: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """Slurm's final word on the run. Until slurmdbd has its end time, ElapsedRaw is "now - start"."""
        return self.end is not None and self.state not in _UNFINISHED


def _nodes(text: str, seen: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """A NodeList expanded once per distinct text; none for "None assigned" or a list that cannot be read.

    The nodes only tie a failed run to a GPU drain (billing.credits); a list this reader does not
    know must not refuse the run's charge.
    """
    nodes = seen.get(text)
    if nodes is None:
        try:
            nodes = tuple(expand_hostlist(text))
        except ParseError:
            nodes = ()
        seen[text] = nodes
    return nodes


class DumpRefused(ParseError):
    """A line of the output that cannot be billed as it stands, so none of the output is."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Tenancy:
    """Which Unix user runs which account's jobs: gpupool's tenants (``gpupool.slurm.tenants``).

    ``users`` maps each account that has a tenant user to that user; any user
    named ``<prefix><account>`` is taken for that account's tenant too, since
    the users table of another database may be the one that made it.
    ``members`` maps each member's own user (``gpupool.models.MemberIdentity``)
    to its account: that user's rows bill that account, and no other.
    """

    prefix: str
    users: Mapping[str, str] = field(default_factory=dict)
    members: Mapping[str, str] = field(default_factory=dict)
    accounts: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "accounts", {user: account for account, user in self.users.items()})

    def is_tenant_account(self, account: str) -> bool:
        return account in self.users

    def mismatch(self, account: str, user: str) -> str | None:
        """Why ``user`` cannot have run a job under ``account``; None when it can."""
        member_of = self.members.get(user)
        if member_of is not None:
            if member_of != account:
                return f"user {user!r} is a member's user of account {member_of!r}, and this row bills account {account!r}"
            return None
        expected = self.users.get(account)
        if expected is not None and user != expected:
            return f"account {account!r} runs jobs as {expected!r} and its members' own users alone, and this row names user {user!r}"
        own = self.accounts.get(user)
        if own is None and self.prefix and user.startswith(self.prefix):
            # Only a name an account could have, which starts with a letter: a member's
            # user (<prefix><uid>-..., gpupool.slurm.tenants.member_user_name) is none.
            rest = user[len(self.prefix):]
            own = rest if "a" <= rest[:1] <= "z" else None
        if own is not None and own != account:
            return f"user {user!r} is the tenant user of account {own!r}, and this row bills account {account!r}"
        return None


NO_TENANTS = Tenancy(prefix="")


def detect_delimiter(header_line: str) -> str:
    """The delimiter of a header line made of known field names, e.g. ``Cluster|JobIDRaw|...``."""
    known = sorted(set(PASS_FIELDS) | set(REQUIRED_FIELDS) | {"ExitCode", "Elapsed"}, key=len, reverse=True)
    first = next((name for name in known if header_line.startswith(name)), None)
    if first is not None:
        rest = header_line[len(first):]
        positions = [position for name in known if (position := rest.find(name)) > 0]
        if positions:
            return rest[: min(positions)]
    raise ParseError(f"cannot tell the delimiter of header {header_line[:120]!r}")


@dataclass
class RunReader:
    """Runs of one sacct text, read lazily (``runs()``), so a pass can write while it reads.

    ``fields`` names the columns of header-less output (``--noheader``); without
    it the first line is the header. ``rows`` counts every row read so far,
    including pending and GPU-less jobs. ``refuse_mismatches``: a row whose user
    and account do not go together (``Tenancy.mismatch``) refuses the output (a
    replay), or is left out and described in ``refused`` (a pass). Lines that are
    not whole rows, and tenants' rows under a delimiter a name can hold, always
    refuse it (see the module docstring).
    """

    text: str
    delimiter: str = "|"
    default_cluster: str | None = None
    fields: tuple[str, ...] | None = None
    tenancy: Tenancy = NO_TENANTS
    refuse_mismatches: bool = True
    rows: int = 0
    refused: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = list(self.fields) if self.fields is not None else read_header(self.text, self.delimiter)
        self.header = [_CANONICAL.get(name.strip().lower(), name.strip()) for name in names]
        missing = [name for name in REQUIRED_FIELDS if name not in self.header]
        if not any(name in self.header for name in ELAPSED_FIELDS):
            missing.append("ElapsedRaw (or Elapsed)")
        if missing:
            raise ParseError(f"sacct output lacks column(s) {', '.join(missing)}; columns were {','.join(names)[:300]!r}")
        free_text = [name for name in self.header if name.lower() in _FREE_TEXT]
        if free_text and (len(free_text) > 1 or self.header[-1] != free_text[0]):
            raise ParseError(
                f"{' and '.join(free_text)} must be the last column, and only one such: text a tenant writes "
                "(here a delimiter or a newline) would otherwise shift the columns of a row"
            )
        self.free_text = bool(free_text)
        if "Cluster" not in self.header and self.default_cluster is None:
            raise ParseError("no Cluster column; name the cluster (--cluster) for this output")

    def job_id_span(self) -> tuple[int, int] | None:
        """Lowest and highest JobIDRaw, by a quick scan; name lines can only widen it."""
        return self._id_scan[0]

    def array_job_ids(self) -> set[int]:
        """The array job ids the JobID column names (``123`` of ``123_4``), by the same quick scan."""
        return self._id_scan[1]

    @cached_property
    def _id_scan(self) -> tuple[tuple[int, int] | None, set[int]]:
        """One pass over the lines, splitting only up to the id columns, before the rows are read.

        A regular expression cannot do this in linear time for a delimiter of several
        characters: ``(?:[^\\n]*?D){n}`` backtracks over every choice of n delimiters in a
        line where the column does not match (4.8 s of a 100,000-row replay's 8.6 s).
        A line a job name's newline began yields nothing or an id no run has, which
        only widens the span or adds an array id to look up.
        """
        raw_index = self.header.index("JobIDRaw")
        array_index = self.header.index("JobID") if "JobID" in self.header else None
        columns = max(raw_index, array_index or 0) + 1
        ids: list[int] = []
        arrays: set[int] = set()
        for line in self.text.split("\n"):
            cells = line.split(self.delimiter, columns)
            if len(cells) <= columns:  # the id columns must be followed by a delimiter
                continue
            if cells[raw_index].isdecimal():
                ids.append(int(cells[raw_index]))
            if array_index is not None:
                base, underscore, task = cells[array_index].partition("_")
                if underscore and base.isdecimal() and task.isdecimal():
                    arrays.add(int(base))
        return ((min(ids), max(ids)) if ids else None, arrays)

    def runs(self) -> Iterator[JobRun]:
        """Every run that was allocated GPUs; pending and never-started jobs bill nothing."""
        column = {name: index for index, name in enumerate(self.header)}
        i_cluster = column.get("Cluster")
        i_raw, i_account, i_state = column["JobIDRaw"], column["Account"], column["State"]
        i_start, i_tres = column["Start"], column["AllocTRES"]
        exact_elapsed = "ElapsedRaw" in column
        i_elapsed = column["ElapsedRaw" if exact_elapsed else "Elapsed"]
        i_id, i_end, i_name = column.get("JobID"), column.get("End"), column.get("JobName")
        i_user = column["User"]
        i_qos = column.get("QOS")
        i_nodes = column.get("NodeList")
        nodes_of: dict[str, tuple[str, ...]] = {}
        default_cluster = self.default_cluster or ""
        width = len(self.header)
        # Only the pass's own delimiter keeps a name's next line from passing for a row.
        names_are_data = not self.free_text or is_unpredictable(self.delimiter)
        # A cluster has few job shapes and states: the same strings recur thousands of times.
        gpus_of: dict[str, dict[str, int]] = {}
        states: dict[str, str] = {}
        # Most rows repeat a (account, user) pair seen before: each pair is judged once.
        verdicts: dict[tuple[str, str], str | None] = {}
        members = self.tenancy.members
        rows = numbered_rows(
            self.text, self.delimiter, width, has_header=self.fields is None, multiline_last=names_are_data
        )
        for line, row in rows:
            if len(row) != width:
                raise DumpRefused(
                    line,
                    f"{len(row)} field(s) where there are {width} columns; a newline in the job name before it? "
                    f"Under {self.delimiter!r} a name's next line cannot be told from a row, so nothing of this "
                    "output is billed (a dump made with sacct --delimiter=<a string no name holds> can be)",
                )
            self.rows += 1
            pair = (row[i_account], row[i_user])
            if pair in verdicts:
                verdict = verdicts[pair]
            else:
                verdict = verdicts[pair] = self._judge(pair[0].strip().lower(), pair[1].strip(), names_are_data)
            if verdict is not None:
                if self.refuse_mismatches or verdict.startswith(_AMBIGUOUS):
                    raise DumpRefused(line, verdict)
                self.refused.append(f"line {line}: job {row[i_raw]!r}: {verdict}")
                continue
            try:
                raw = row[i_raw]
                if not raw.isdigit():
                    continue  # a step (12.batch) of output read without -X
                tres = row[i_tres]
                if "gres/gpu" not in tres:
                    continue
                elapsed_text = row[i_elapsed]
                if elapsed_text.isdigit():
                    elapsed_s = int(elapsed_text)
                elif exact_elapsed:
                    raise ParseError(f"job {raw}: ElapsedRaw {elapsed_text!r} is not a number of seconds")
                else:
                    try:
                        elapsed_s = parse_elapsed(elapsed_text)
                    except ParseError as exc:
                        raise ParseError(f"job {raw}: {exc}") from exc
                state = states.get(row[i_state])
                if state is None:
                    state = states[row[i_state]] = base_state(row[i_state])
                start_text = row[i_start]
                start = parse_time(start_text)
                if start is None or state == "PENDING":
                    continue  # never allocated: no charge
                # A run with ElapsedRaw 0 bills nothing, but is kept: it may correct seconds
                # billed while slurmdbd still thought it was running.
                gpus = gpus_of.get(tres)
                if gpus is None:
                    gpus = gpus_of[tres] = gpus_by_type(tres)
                if not gpus:
                    continue
                end_text = row[i_end] if i_end is not None else ""
                end = parse_time(end_text)
                run = JobRun(
                    cluster=row[i_cluster] if i_cluster is not None else default_cluster,
                    job_id_raw=int(raw),
                    job_id=row[i_id] if i_id is not None else raw,
                    account=row[i_account].lower(),
                    state=state,
                    start=start,
                    end=end,
                    elapsed_s=elapsed_s,
                    gpus=gpus,
                    name=row[i_name].replace("\x00", "") if i_name is not None else "",
                    start_text=start_text,
                    end_text=end_text if end is not None else "",
                    qos=(row[i_qos].strip().lower() or "normal") if i_qos is not None else "normal",
                    # Past the verdict, a member's user is its own account's.
                    member_user=pair[1].strip() if members and pair[1].strip() in members else None,
                    nodes=_nodes(row[i_nodes], nodes_of) if i_nodes is not None else (),
                )
            except ParseError as exc:
                raise DumpRefused(line, str(exc)) from exc
            yield run

    def _judge(self, account: str, user: str, names_are_data: bool) -> str | None:
        """Why a row of ``account`` run by ``user`` cannot be billed; None when it can."""
        if not names_are_data and self.tenancy.is_tenant_account(account):
            return (
                f"{_AMBIGUOUS} {self.delimiter!r}, which a tenant's free text can hold, and this row bills account "
                f"{account!r}, a gpupool tenant's: it may be the end of the previous job's name. Bill this "
                "cluster's history with `gpupool billing run --since ... --until ...`, or replay the pass's own archive"
            )
        return self.tenancy.mismatch(account, user)


# The start of the refusal no pass may skip past: the output itself is ambiguous, not one row.
_AMBIGUOUS = "the columns are separated by"


def read_gpu_failures(text: str, delimiter: str) -> dict[int, GpuFailure]:
    """JobIDRaw -> the GPU failure its AdminComment records, from ``SlurmClient.admin_comments`` output.

    Read by the header row, AdminComment last (an operator's comment may hold a newline:
    its further lines continue it). Every run of a job carries the same comment; any
    other comment (an operator's own words) is no failure.
    """
    header = [name.strip().lower() for name in read_header(text, delimiter)]
    if "jobidraw" not in header or header[-1] != "admincomment":
        raise ParseError(f"expected JobIDRaw and AdminComment last; columns were {header!r}")
    i_raw = header.index("jobidraw")
    failures: dict[int, GpuFailure] = {}
    for _line, row in numbered_rows(text, delimiter, len(header), multiline_last=True):
        if len(row) != len(header) or not row[i_raw].isdigit():
            continue
        failure = parse_comment(row[-1].split("\n", 1)[0])
        if failure is not None:
            failures[int(row[i_raw])] = failure
    return failures
