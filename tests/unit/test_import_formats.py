"""Historical import formats: header-less dumps, Open XDMoD's export, Elapsed without ElapsedRaw."""

from __future__ import annotations

import datetime as dt

import pytest

from bench.support.metering import parse_runs
from billing.sacct import XDMOD_FIELDS, DumpRefused, Tenancy
from gpupool.slurm.parse import ParseError, expand_hostlist, parse_elapsed

# Open XDMoD's shredder format (26 fields, no header), two lines in its shape.
XDMOD_LINES = (
    "196835|196835|phillips|focaccia|chestnut|chaff|chaff|45789|noror|380693|2017-01-01T21:44:50|2017-01-01T21:44:50"
    "|2017-01-01T21:44:50|2017-01-01T21:45:07|00:00:17|0:0|COMPLETED|1|12|12|31000Mn|cpu=12,node=1"
    "|billing=12,cpu=12,gres/gpu=2,mem=31000M,node=1|37-14:00:00|cpn-f11-31|b24c|name\n"
    "163485|163485|phillips|focaccia|chestnut|chaff|chaff|45789|noror|380693|2016-12-22T07:15:12|2016-12-22T07:15:12"
    "|2016-12-22T07:15:13|2017-01-01T20:42:19|10-13:27:06|0:0|CANCELLED by 380693|1|12|12|31000Mn|cpu=12,node=1"
    "|billing=12,cpu=12,gres/gpu=2,mem=31000M,node=1|37-14:00:00|cpn-f11-31|290d\n"
    "3483276|3483276|phillips|black|qos|taifl|taifl|311132|honbu|311132|2020-07-01T15:28:17|2020-07-01T15:28:17"
    "|Unknown|2020-07-01T15:28:17|00:00:00|0:0|PENDING|1|40|40|120000Mn|billing=40,cpu=40,mem=120000M,node=1"
    "||3-00:00:00|cpn-k07-02-01|21Py\n"
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00:17", 17), ("10-13:27:06", 912426), ("1-02:03:04", 93784), ("123:00:00", 442800), (" 00:01:00 ", 60)],
)
def test_elapsed_in_slurm_s_shape(text: str, seconds: int) -> None:
    assert parse_elapsed(text) == seconds


@pytest.mark.parametrize("text", ["", "17", "1:2", "00:60:00", "1-", "x-00:00:01", "UNLIMITED", "00:00:17.5"])
def test_elapsed_refuses_anything_else(text: str) -> None:
    with pytest.raises(ParseError):
        parse_elapsed(text)


def test_host_lists_expand_as_slurm_compresses_them() -> None:
    assert expand_hostlist("cpn-f13-03-[01-02],d13n[03,05,07-08],vm") == [
        "cpn-f13-03-01", "cpn-f13-03-02", "d13n03", "d13n05", "d13n07", "d13n08", "vm",
    ]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("None assigned") == []
    with pytest.raises(ParseError):
        expand_hostlist("gpu[a-b]")


def test_xdmod_export_without_a_header() -> None:
    parsed = parse_runs(XDMOD_LINES, fields=XDMOD_FIELDS)
    assert parsed.rows == 3  # the pending job is read, and bills nothing
    assert [(r.cluster, r.job_id_raw, r.account, r.state, r.elapsed_s, r.gpus, r.name) for r in parsed.runs] == [
        ("phillips", 196835, "chaff", "COMPLETED", 17, {"untyped": 2}, "b24c|name"),
        ("phillips", 163485, "chaff", "CANCELLED", 912426, {"untyped": 2}, "290d"),
    ]
    assert parsed.runs[1].start == dt.datetime(2016, 12, 22, 7, 15, 13, tzinfo=dt.UTC)
    assert parsed.runs[1].finished


def test_elapsed_stands_in_for_elapsedraw_and_field_names_take_any_case() -> None:
    text = "cluster|jobidraw|account|user|state|start|end|elapsed|alloctres\nc|7|Acme|u|COMPLETED|2026-11-01T00:00:00|2026-11-02T01:00:00|1-01:00:00|gres/gpu:rtx4090=1,gres/gpu=1\n"
    (run,) = parse_runs(text).runs
    assert (run.account, run.elapsed_s, run.gpus) == ("acme", 90000, {"rtx4090": 1})
    with pytest.raises(ParseError, match="job 7: not a Slurm elapsed time"):
        parse_runs(text.replace("1-01:00:00", "25h"))


def test_a_header_less_dump_must_name_what_billing_needs() -> None:
    with pytest.raises(ParseError, match=r"lacks column\(s\) Account, User, ElapsedRaw \(or Elapsed\)"):
        parse_runs("7|COMPLETED\n", fields=("JobIDRaw", "State", "Start", "AllocTRES"), default_cluster="c")
    with pytest.raises(ParseError, match="JobName must be the last"):
        parse_runs("", fields=("JobIDRaw", "JobName", "Account", "User", "State", "Start", "Elapsed", "AllocTRES"), default_cluster="c")


def test_an_xdmod_export_with_a_newline_in_a_name_is_refused_with_the_line() -> None:
    """A name that goes on to a line of its own: under '|' that line may be anything, so nothing is billed."""
    lines = XDMOD_LINES.split("\n")
    text = "\n".join([lines[0] + "\nsecond line of the name", *lines[1:]])
    with pytest.raises(DumpRefused, match=r"^line 2: 1 field\(s\) where there are 26 columns"):
        parse_runs(text, fields=XDMOD_FIELDS)


def test_an_xdmod_export_with_a_forged_row_for_a_tenant_is_refused() -> None:
    """A job name 'b24c\\n<a whole XDMoD line>' billing a gpupool tenant 40 GPU-hours: refused at that line."""
    forged = (
        "999999|999999|phillips|focaccia|chestnut|victim|victim|45789|gp-victim|380693|2017-01-01T21:44:50|2017-01-01T21:44:50"
        "|2017-01-01T21:44:50|2017-01-02T07:44:50|10:00:00|0:0|COMPLETED|1|12|12|31000Mn|cpu=12,node=1"
        "|billing=12,cpu=12,gres/gpu=4,mem=31000M,node=1|37-14:00:00|cpn-f11-31|forged"
    )
    lines = XDMOD_LINES.split("\n")
    text = "\n".join([lines[0] + "\n" + forged, *lines[1:]])
    tenants = Tenancy("gp-", {"victim": "gp-victim"})
    with pytest.raises(DumpRefused, match="^line 2: the columns are separated by '[|]'.*'victim', a gpupool tenant's"):
        parse_runs(text, fields=XDMOD_FIELDS, tenancy=tenants)
    # Without the forged line the export bills as before: the refusal is that line's.
    assert len(parse_runs(XDMOD_LINES, fields=XDMOD_FIELDS, tenancy=tenants).runs) == 2
