"""``gpupool-client``: the customer's command line.

With ``--wait`` (or ``--follow``) ``submit`` exits with the job's own exit
code when it COMPLETED or FAILED, and with a fixed code for every other end
(``EXIT_BY_STATE``), so shell scripts and CI can branch on the outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import webbrowser
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool_client.client import Client, Job
from gpupool_client.errors import GpupoolError, ValidationFailed

if TYPE_CHECKING:
    from gpupool_client._core import JobArgs

# Chosen to echo the shell: 124 is timeout(1)'s code, 130 is 128+SIGINT, 137 is 128+SIGKILL (the OOM killer).
EXIT_BY_STATE = {
    "TIMEOUT": 124,
    "NODE_FAIL": 125,
    "CANCELLED": 130,
    "OUT_OF_MEMORY": 137,
    "UNKNOWN": 122,  # Slurm never reported the job: gpupool cannot say how it ended
}
EXIT_OTHER_END = 123  # PREEMPTED, BOOT_FAIL, DEADLINE and any state Slurm adds later
EXIT_ERROR = 1  # the API refused or could not be reached: the job's outcome is unknown
EXIT_INTERRUPTED = 130  # Ctrl-C while waiting; the job itself keeps running


def job_exit_code(job: Job) -> int:
    """The process exit code that stands for how ``job`` ended."""
    if job.state in ("COMPLETED", "FAILED"):
        if job.exit_code:
            return job.exit_code
        if job.state == "COMPLETED":
            return 0
        # FAILED without a status of its own: killed by a signal, or the submission was lost.
        return 128 + job.exit_signal if job.exit_signal else 1
    return EXIT_BY_STATE.get(job.state, EXIT_OTHER_END)


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value``; the value is JSON when it parses as JSON (5, true, [1,2]), else the text as is."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _describe(job: Job) -> str:
    parts = [f"job {job.id} {job.state}"]
    if job.reason:
        parts.append(f"({job.reason})")
    if job.exit_code is not None and job.done:
        parts.append(f"exit {job.exit_code}")
    if job.elapsed_s is not None:
        parts.append(f"after {job.elapsed_s} s")
    return " ".join(parts)


def _follow_to_stdout(client: Client, job_id: str, stream: str) -> None:
    for line in client.follow(job_id, stream=stream):
        sys.stdout.write(line)
        sys.stdout.flush()


def _print_quote(answer: dict[str, Any]) -> None:
    quote = answer["quote"]
    cost = quote["worst_case_cost"]
    price = quote["price_per_gpu_second"]
    print(f"at most:          {cost + ' ' + quote['currency'] if cost is not None else 'no price set'}")
    print(f"GPU-seconds:      {quote['gpu_seconds_worst_case']} ({quote['gpus']} GPU(s) x {quote['time_limit_min']} min)")
    print(f"per GPU-second:   {price + ' ' + quote['currency'] if price is not None else 'no price set'}")
    print(f"estimated start:  {answer['estimated_start'] or 'no estimate from Slurm'}")


def _job_args(args: argparse.Namespace) -> JobArgs:
    """What ``submit`` and its ``--dry-run`` ask for, from the command line."""
    return {
        "gpus": args.gpus, "params": dict(args.param), "gpu_type": args.gpu_type, "name": args.name,
        "container_image": args.image, "cpus": args.cpus, "mem_gb": args.mem_gb, "time_limit_min": args.time_limit,
    }


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    if args.dry_run:
        if args.wait or args.follow:
            raise SystemExit("gpupool-client: --dry-run submits nothing, so there is nothing to --wait for or --follow")
        answer = client.quote(args.template, **_job_args(args))
        if args.json:
            _print_json(answer)
        else:
            _print_quote(answer)
        return 0
    asked = _job_args(args)
    asked["preemptible"] = args.preemptible
    asked["requeue_on_failure"] = args.requeue_on_failure
    job = client.submit(args.template, **asked)
    if not (args.wait or args.follow):
        if args.json:
            _print_json(job.data)
        else:
            print(job.id)
        return 0
    print(f"submitted job {job.id}", file=sys.stderr)
    if args.follow:
        _follow_to_stdout(client, job.id, "stdout")
    job.wait()
    if args.json:
        _print_json(job.data)
    print(_describe(job), file=sys.stderr)
    return job_exit_code(job)


def cmd_session(client: Client, args: argparse.Namespace) -> int:
    job = client.submit(
        args.template, gpus=args.gpus, params=dict(args.param), gpu_type=args.gpu_type, name=args.name,
        container_image=args.image, time_limit_min=args.time_limit, idle_timeout_min=args.idle_timeout,
    )
    print(f"submitted session job {job.id}; waiting for it to be ready", file=sys.stderr)
    session = client.wait_session(job.id, args.timeout)
    if args.json:
        _print_json(session)
    else:
        print(session["link"])
        print(f"single-use, valid {session['link_expires_in_s']} s; `gpupool-client session-link {job.id}` makes another",
              file=sys.stderr)
    if args.open:
        webbrowser.open(session["link"])
    return 0


def cmd_session_link(client: Client, args: argparse.Namespace) -> int:
    session = client.session(args.job_id)
    if args.json:
        _print_json(session)
        return 0
    if session["link"] is None:
        print(f"gpupool-client: session {args.job_id} has ended: {session.get('end_reason') or 'see its job'}", file=sys.stderr)
        return EXIT_ERROR
    print(session["link"])
    if args.open:
        webbrowser.open(session["link"])
    return 0


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.job(args.job_id)
    if args.json:
        _print_json(job.data)
        return 0
    for key, value in job.data.items():
        if value is not None and key != "params":
            print(f"{key}: {value}")
    print(f"params: {json.dumps(job.data.get('params', {}))}")
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.follow:
        _follow_to_stdout(client, args.job_id, args.stream)
    else:
        sys.stdout.write(client.logs(args.job_id, stream=args.stream, tail=args.tail))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.cancel(args.job_id)
    print(f"cancel requested for job {job.id}")
    return 0


def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    jobs = client.jobs(state=args.state, limit=args.limit)
    if args.json:
        _print_json([job.data for job in jobs])
        return 0
    print(f"{'JOB ID':<36}  {'STATE':<13}  {'TEMPLATE':<12}  {'GPUS':>4}  {'EXIT':>4}  SUBMITTED")
    for job in jobs:
        exit_code = "" if job.exit_code is None else str(job.exit_code)
        print(f"{job.id:<36}  {job.state:<13}  {job.data['template']:<12}  {job.data['gpus']:>4}  {exit_code:>4}  {job.data.get('submitted_at') or ''}")
    return 0


def cmd_templates(client: Client, args: argparse.Namespace) -> int:
    templates = client.templates()
    if args.json:
        _print_json(templates)
        return 0
    for template in templates:
        gpus = f"{template['min_gpus']}-{template['max_gpus'] or 'any'} GPUs (default {template['default_gpus']})"
        params = ", ".join(template["params_schema"].get("properties", {}))
        print(f"{template['name']}: {template['description']}\n    {gpus}; params: {params or 'none'}")
    return 0


def cmd_usage(client: Client, args: argparse.Namespace) -> int:
    usage = client.usage(args.period)
    if args.json:
        _print_json(usage)
        return 0
    currency = usage["currency"]
    print(f"account {usage['account']}, {usage['period']}: {usage['gpu_seconds']} GPU-seconds, total {usage['total']} {currency}")
    for row in usage["by_gpu_type"]:
        print(f"    {row['gpu_type']:<12} {row['gpu_seconds']:>12} GPU-s  {row['amount']} {currency}")
    remaining = usage["balance"].get("remaining")
    if remaining is not None:
        print(f"remaining budget: {remaining} {currency}")
    return 0


def cmd_invoice(client: Client, args: argparse.Namespace) -> int:
    path = client.invoice(args.period, args.output)
    print(path)
    return 0


REMOTE = "remote:"


def _remote(text: str) -> str | None:
    """The path of a ``remote:PATH`` argument in the account's storage; None for a local path."""
    return text[len(REMOTE):].lstrip("/") if text.startswith(REMOTE) else None


@contextlib.contextmanager
def _progress_bar(args: argparse.Namespace, label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A tqdm bar on stderr while stdout is a terminal (or with --progress); nothing with --no-progress or in a pipe."""
    show = args.progress if args.progress is not None else sys.stdout.isatty()
    if not show:
        yield None
        return
    from tqdm import tqdm  # only on a terminal: scripts never pay for the import

    bars: list[Any] = []

    def update(done: int, total: int) -> None:
        if not bars or bars[0].total != total:  # made once the size is known (a download's, from its answer)
            if bars:
                bars.pop().close()
            bars.append(tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr))
        bars[0].update(done - bars[0].n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


def cmd_cp(client: Client, args: argparse.Namespace) -> int:
    source, target = _remote(args.source), _remote(args.target)
    if (source is None) == (target is None):
        raise SystemExit("gpupool-client: cp copies between a local path and remote:PATH (your storage); give one of each")
    if target is not None:
        local = Path(args.source)
        if not local.is_file():
            raise SystemExit(f"gpupool-client: {local} is not a file")
        if target == "" or target.endswith("/"):
            target += local.name
        with _progress_bar(args, local.name) as progress:
            stored = client.upload(local, target, resume=args.resume, progress=progress)
        print(f"{local} -> remote:{stored['path']} ({stored['size']} bytes)", file=sys.stderr)
        return 0
    assert source is not None
    destination = Path(args.target)
    if destination.is_dir():
        destination = destination / Path(source).name
    with _progress_bar(args, Path(source).name) as progress:
        written = client.download(source, destination, progress=progress)
    print(f"remote:{source} -> {written} ({os.path.getsize(written)} bytes)", file=sys.stderr)
    return 0


def cmd_ls(client: Client, args: argparse.Namespace) -> int:
    folder = _remote(args.path)
    return _print_entries(args, client.list_files(args.path if folder is None else folder), "name")


def _print_entries(args: argparse.Namespace, entries: list[dict[str, Any]], name: str) -> int:
    """A listing as the API's JSON (--json), or a line an entry, each named by its ``name`` field."""
    if args.json:
        _print_json(entries)
        return 0
    for entry in entries:
        size = "-" if entry["size"] is None else str(entry["size"])
        suffix = "/" if entry["type"] == "folder" else " -> (link, not followed)" if entry["type"] == "link" else ""
        print(f"{size:>14}  {entry['modified']}  {entry[name]}{suffix}")
    return 0


def cmd_outputs(client: Client, args: argparse.Namespace) -> int:
    """List a job's outputs (every file, folders walked), or with --dest download them (or one path) there."""
    path = args.path.strip("/") if args.path else ""
    whole_folder = not path or args.path.endswith("/")
    if args.dest is None:
        entries = client.output_files(args.job_id, path) if whole_folder else [
            {**entry, "path": entry["name"]} for entry in client.list_outputs(args.job_id, path.rpartition("/")[0])
            if entry["name"] == path.rpartition("/")[2]
        ]
        return _print_entries(args, entries, "path")
    dest = Path(args.dest)
    if not whole_folder:
        dest.mkdir(parents=True, exist_ok=True)
        with _progress_bar(args, path) as progress:
            written = client.download_output(args.job_id, path, dest / Path(path).name, progress=progress)
        print(f"{path} -> {written} ({os.path.getsize(written)} bytes)", file=sys.stderr)
        return 0
    prefix = path + "/" if path else ""
    for entry in client.output_files(args.job_id, path):
        local = dest / entry["path"][len(prefix):]
        if entry["type"] == "folder":
            local.mkdir(parents=True, exist_ok=True)
        elif entry["type"] == "file":
            local.parent.mkdir(parents=True, exist_ok=True)
            with _progress_bar(args, entry["path"]) as progress:
                client.download_output(args.job_id, entry["path"], local, progress=progress)
            print(f"{entry['path']} -> {local} ({entry['size']} bytes)", file=sys.stderr)
        else:  # a link is the job's own name, never followed: outputs.tar keeps it as a link
            print(f"{entry['path']}: a {entry['type']}, not downloaded", file=sys.stderr)
    return 0


def cmd_rm(client: Client, args: argparse.Namespace) -> int:
    remote = _remote(args.path)
    client.delete_file(args.path if remote is None else remote, recursive=args.recursive)
    return 0


def cmd_mv(client: Client, args: argparse.Namespace) -> int:
    source, target = (_remote(text) or text for text in (args.source, args.target))
    moved = client.move_file(source, target, overwrite=args.overwrite)
    print(f"remote:{source} -> remote:{moved['path']}", file=sys.stderr)
    return 0


# A subcommand: what it does with the client and its parsed arguments; its exit status.
Handler = Callable[[Client, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupool-client", description="Submit and follow GPU jobs on gpupool.")
    parser.add_argument("--url", help="API address (default: $GPUPOOL_URL)")
    parser.add_argument("--token", help="bearer token (default: $GPUPOOL_TOKEN)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, handler: Handler, *, json: bool = False) -> argparse.ArgumentParser:
        """A subcommand run by ``handler``; ``json``: it can print the API's JSON instead of text."""
        sub = commands.add_parser(name, help=help_text)
        if json:
            sub.add_argument("--json", action="store_true", help="print the API's JSON")
        sub.set_defaults(handler=handler)
        return sub

    def job_command(name: str, help_text: str, handler: Handler, param_help: str) -> argparse.ArgumentParser:
        """A subcommand that starts a job from a template: the options submit and session share."""
        sub = command(name, help_text, handler, json=True)
        sub.add_argument("template")
        sub.add_argument("--gpus", type=int)
        sub.add_argument("-p", "--param", action="append", type=parse_param, default=[], metavar="KEY=VALUE", help=param_help)
        sub.add_argument("--gpu-type")
        sub.add_argument("--name")
        sub.add_argument("--image", help="container image")
        return sub

    submit = job_command(
        "submit", "submit a job from a template", cmd_submit,
        "template parameter; VALUE is read as JSON if it is valid JSON, else as text (repeatable)",
    )
    submit.add_argument("--cpus", type=int)
    submit.add_argument("--mem-gb", type=int)
    submit.add_argument("--time-limit", type=int, metavar="MINUTES")
    submit.add_argument("--preemptible", action="store_true", help="spot price; a full-price job may preempt (requeue) it")
    submit.add_argument(
        "--requeue-on-failure", action="store_true",
        help="if a GPU under the job fails, run it again on a healthy node (the failed run is credited)",
    )
    submit.add_argument("--wait", action="store_true", help="wait for the end; exit with the job's exit code")
    submit.add_argument("--follow", action="store_true", help="print the job's output as it runs (implies --wait)")
    submit.add_argument("--dry-run", action="store_true", help="submit nothing: print the worst-case cost and Slurm's start estimate")

    session = job_command(
        "session", "start an interactive session (jupyter, webapp) and print its single-use link", cmd_session,
        "template parameter, as for submit (repeatable)",
    )
    session.add_argument("--time-limit", type=int, metavar="MINUTES")
    session.add_argument("--idle-timeout", type=int, metavar="MINUTES", help="stop it after this long idle (at most the template's)")
    session.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    session.add_argument("--open", action="store_true", help="open the link in the browser")

    session_link = command("session-link", "a new single-use link to a running session", cmd_session_link, json=True)
    session_link.add_argument("job_id")
    session_link.add_argument("--open", action="store_true", help="open the link in the browser")

    status = command("status", "show one job", cmd_status, json=True)
    status.add_argument("job_id")

    logs = command("logs", "print a job's output", cmd_logs)
    logs.add_argument("job_id")
    logs.add_argument("-f", "--follow", action="store_true", help="print everything, then new output until the job ends")
    logs.add_argument("--stderr", dest="stream", action="store_const", const="stderr", default="stdout")
    logs.add_argument("--tail", type=int, help="last N lines (without -f)")

    cancel = command("cancel", "cancel a job", cmd_cancel)
    cancel.add_argument("job_id")

    jobs = command("jobs", "list the account's jobs, newest first", cmd_jobs, json=True)
    jobs.add_argument("--state", help="comma-separated states, e.g. RUNNING,PENDING")
    jobs.add_argument("--limit", type=int, help="at most this many")

    command("templates", "list templates and their parameters", cmd_templates, json=True)

    usage = command("usage", "GPU-seconds, charges and balance for a month", cmd_usage, json=True)
    usage.add_argument("--period", help="YYYY-MM (default: this month)")

    invoice = command("invoice", "download a month's CSV invoice", cmd_invoice)
    invoice.add_argument("period", metavar="PERIOD", help="YYYY-MM")
    invoice.add_argument("-o", "--output", metavar="FILE", help="default: the server's file name, in this folder")

    # The account's storage: every job sees it as $GPUPOOL_DATA (/data in a container).
    copy = command("cp", "copy a file to (remote:PATH) or from your account's storage, streamed", cmd_cp)
    copy.add_argument("source", metavar="SOURCE", help="a local file, or remote:PATH")
    copy.add_argument("target", metavar="TARGET", help="remote:PATH (ending in / keeps the file's name), or a local path")
    copy.add_argument("--resume", action="store_true", help="continue an upload an earlier cp left unfinished")
    copy.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a progress bar on stderr (default: when stdout is a terminal)")

    listing = command("ls", "list a folder of your account's storage", cmd_ls, json=True)
    listing.add_argument("path", nargs="?", default="", metavar="PATH", help="remote:PATH or PATH (default: the top)")

    outputs = command("outputs", "list a job's outputs ($GPUPOOL_JOB_DIR/output), or download them with --dest", cmd_outputs, json=True)
    outputs.add_argument("job_id", metavar="JOB")
    outputs.add_argument("path", nargs="?", default="", metavar="PATH", help="one file, or a folder ending in / (default: all)")
    outputs.add_argument("--dest", metavar="DIR", help="download into DIR (folders kept; links are not followed, so not downloaded)")
    outputs.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="a progress bar on stderr (default: when stdout is a terminal)")

    remove = command("rm", "delete a file or an empty folder of your account's storage", cmd_rm)
    remove.add_argument("path", metavar="PATH", help="remote:PATH or PATH")
    remove.add_argument("-r", "--recursive", action="store_true", help="a folder and everything in it")

    move = command("mv", "rename within your account's storage", cmd_mv)
    move.add_argument("source", metavar="SOURCE")
    move.add_argument("target", metavar="TARGET")
    move.add_argument("--overwrite", action="store_true", help="replace a file at TARGET")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with Client(args.url, args.token) as client:
            return args.handler(client, args)
    except ValidationFailed as exc:
        print(f"gpupool-client: {exc.message}", file=sys.stderr)
        for error in exc.errors:
            print(f"    {error.get('field') or 'body'}: {error.get('message')}", file=sys.stderr)
        return EXIT_ERROR
    except GpupoolError as exc:
        print(f"gpupool-client: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("gpupool-client: interrupted; a job already submitted goes on, an upload can go on with cp --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0  # `gpupool-client logs ID | head` closed the pipe early


if __name__ == "__main__":
    sys.exit(main())
