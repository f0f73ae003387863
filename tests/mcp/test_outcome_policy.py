"""The one outcome policy: the docs' table is the code's, and records splice byte for byte."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from idemstore.mcp import json_splice
from idemstore.mcp.outcome_policy import CASES, POLICY, case_of, decide
from idemstore.mcp.sep3182 import REPLAYED_META_KEY
from tests.conftest import ROOT

# One final answer per row of the table, in its order.
SAMPLES: list[dict[str, Any] | None] = [
    {"result": {"content": []}},
    {"result": {"resultType": "task", "taskId": "t-1", "status": "working"}},
    {"result": {"content": [], "isError": True}},
    {"error": {"code": -32001, "message": "the tool failed"}},
    {"error": {"code": -32602, "message": "invalid params"}},
    {"error": {"code": -32800, "message": "Request cancelled"}},
    {"result": {"resultType": "input_required", "inputRequests": {}}},
    None,
]
_DECISIONS = {"recorded": "record", "released": "release"}
COLUMNS = ("sep", "sep", "meta", "derived")  # proxy/gateway SEP, server adapters SEP, ...


def _documented() -> list[list[str]]:
    page = (ROOT / "docs" / "mcp-proxy.md").read_text()
    section = page.split("## What is recorded", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[: len(CASES)]]


def test_each_sample_falls_in_its_row() -> None:
    assert [case_of(sample) for sample in SAMPLES] == list(CASES)


def test_the_documented_table_is_the_policy() -> None:
    documented = _documented()
    assert len(documented) == len(CASES)
    for sample, case, row in zip(SAMPLES, CASES, documented, strict=True):
        cells = [_DECISIONS[re.sub(r"[^a-z]", "", cell)] for cell in row[1:]]
        assert cells == [POLICY[case][kind] for kind in COLUMNS], (case, row)
        assert [decide(sample, kind) for kind in COLUMNS] == cells


MARK = b'"' + REPLAYED_META_KEY.encode() + b'":true'


@pytest.mark.parametrize(
    ("line", "replay"),
    [
        # _meta added as the result's first member; spacing and numbers as written.
        (
            b'{ "jsonrpc":"2.0", "id":1, "result": {"n": 1e400} }\n',
            b'{"jsonrpc":"2.0","id":9,"result": {"_meta":{' + MARK + b'},"n": 1e400}}\n',
        ),
        (
            b'{"id":1,"jsonrpc":"2.0","result":{}}',
            b'{"jsonrpc":"2.0","id":9,"result":{"_meta":{' + MARK + b"}}}\n",
        ),
        # Into an existing _meta (the last one, as parsers keep), or over a marker already there.
        (
            b'{"jsonrpc":"2.0","id":1,"result":{"_meta":{},"_meta":{"a":1.0}}}',
            b'{"jsonrpc":"2.0","id":9,"result":{"_meta":{},"_meta":{' + MARK + b',"a":1.0}}}\n',
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"result":{"_meta":{"'
            + REPLAYED_META_KEY.encode()
            + b'":false}}}',
            b'{"jsonrpc":"2.0","id":9,"result":{"_meta":{' + MARK + b"}}}\n",
        ),
        # Errors and results that are not objects are left as recorded.
        (
            b'{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"caf\\u00e9"}}',
            b'{"jsonrpc":"2.0","id":9,"error":{"code":-32001,"message":"caf\\u00e9"}}\n',
        ),
        (b'{"jsonrpc":"2.0","id":1,"result":[1.0]}', b'{"jsonrpc":"2.0","id":9,"result":[1.0]}\n'),
        # Line breaks between tokens (a pretty-printed HTTP body) become spaces.
        (
            b'{\n  "jsonrpc": "2.0",\n  "id": 1,\n  "result": {\n    "x": -0\n  }\n}\n',
            b'{"jsonrpc":"2.0","id":9,"result": {"_meta":{' + MARK + b'},     "x": -0   }}\n',
        ),
    ],
)
def test_a_replay_is_the_record_spliced_never_re_encoded(line: bytes, replay: bytes) -> None:
    stored = json_splice.recorded(line)
    assert b"\n" not in stored
    assert json_splice.replay_line(b"9", stored, REPLAYED_META_KEY) == replay
    json.loads(replay)


def test_a_record_in_the_old_format_replays_the_same_way() -> None:
    stored = b'{"result":{"content":[],"isError":false}}'  # written by json.dumps before
    replay = json_splice.replay_line(b'"r"', stored, REPLAYED_META_KEY)
    assert (
        replay
        == b'{"jsonrpc":"2.0","id":"r","result":{"_meta":{' + MARK + b"}," + stored[11:] + b"\n"
    )


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"[]",
        b'{"a":1',
        b'{"a":1}x',
        b'{"a" 1}',
        b"{1:2}",
        # The usual envelope, broken where a reader of only its first members would miss it.
        b'{"jsonrpc":"2.0","id":1,"result":{}}x',
        b'{"jsonrpc":"2.0","id":1,"result":{},}',
        b'{"jsonrpc":"2.0","id":1,"result":{"a":}}',
        b'{"jsonrpc":"2.0","id":01,"result":{}}',
        b'{"jsonrpc":"2.0","id":"\x01","result":{}}',
        b'{"jsonrpc":"2.0",\xc2\xa0"id":1,"result":{}}',  # a no-break space is not JSON's
    ],
)
def test_bytes_that_are_not_one_object_are_refused(text: bytes) -> None:
    with pytest.raises(ValueError):
        json_splice.recorded(text)


@pytest.mark.parametrize(
    ("line", "stored"),
    [
        (b'{"jsonrpc":"2.0","id":1,"result":{"a":1}}\n', b'{"result":{"a":1}}'),
        (b' { "jsonrpc" : "2.0" , "id" : "x" , "error" : 1 } \r\n', b'{"error" : 1}'),
        # Members after the result: every one is looked at, the envelope's repeats dropped.
        (b'{"jsonrpc":"2.0","id":1,"result":1,"id":2,"jsonrpc":"2.0"}', b'{"result":1}'),
        (b'{"jsonrpc":"2.0","id":1,"result":1,"result":2}', b'{"result":1,"result":2}'),
        (b'{"jsonrpc":"2.0","id":1,"result":1,"_meta":{}}', b'{"result":1,"_meta":{}}'),
        # Ids the short reading does not take (escapes, fractions) are read member by member.
        (b'{"jsonrpc":"2.0","id":"a\\"b","result":[]}', b'{"result":[]}'),
        (b'{"jsonrpc":"2.0","id":1.5,"result":[]}', b'{"result":[]}'),
        (b'{"id":1,"jsonrpc":"2.0","result":[]}', b'{"result":[]}'),
    ],
)
def test_a_record_is_every_member_but_the_envelope(line: bytes, stored: bytes) -> None:
    assert json_splice.recorded(line) == stored
