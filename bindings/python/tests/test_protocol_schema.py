"""The client's typed replies against the protocol's JSON schema, and the version rule.

``docs/protocol.schema.json`` is generated from the daemon's Rust types (a Rust test fails when
it is stale). Here every field of :class:`Hello`, :class:`Status`, :class:`FilesView` and
:class:`Decision` must name a property of the matching reply in that schema, so a field renamed
on either side fails a test. Real replies are validated against it in
``test_protocol_replies.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jsonschema
import pytest
from fake_daemon import FakeDaemon

import metfs
from metfs.client import (
    PROTOCOL_VERSION,
    Decision,
    FilesView,
    Hello,
    Replay,
    Status,
    check_version,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_PATH = os.path.join(HERE, "..", "..", "..", "docs", "protocol.schema.json")

#: Each typed reply and the schema definition of the reply it reads.
TYPED = [
    (Hello, "HelloReply"),
    (Status, "StatusReply"),
    (FilesView, "FilesViewReply"),
    (Decision, "DecisionReply"),
]


def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH) as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


def validator(definition: str) -> Any:
    """A validator of one message kind (``$defs`` name) of the protocol's schema."""
    s = schema()
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    return cls({"$ref": f"#/$defs/{definition}", "$defs": s["$defs"]})


def protocol_fields(cls: type[Any]) -> dict[str, str]:
    """The dataclass's fields read from the daemon, by attribute: attribute -> protocol name."""
    renames: dict[str, str] = getattr(cls, "PROTOCOL_NAMES", {})
    derived: frozenset[str] = getattr(cls, "DERIVED", frozenset())
    return {
        f.name: renames.get(f.name, f.name)
        for f in dataclasses.fields(cls)
        if f.name != "raw" and f.name not in derived
    }


def test_the_schema_is_this_clients_version() -> None:
    s = schema()
    assert s["version"] == PROTOCOL_VERSION
    assert s["$defs"]["Version"]["const"] == PROTOCOL_VERSION


@pytest.mark.parametrize(("cls", "definition"), TYPED, ids=[d for _, d in TYPED])
def test_every_typed_field_is_a_field_of_the_schema(cls: type[Any], definition: str) -> None:
    properties = schema()["$defs"][definition]["properties"]
    missing = {a: p for a, p in protocol_fields(cls).items() if p not in properties}
    assert not missing, (
        f"{cls.__name__} reads fields the protocol's {definition} does not have: {missing}; "
        f"the schema has {sorted(properties)}"
    )
    renames: dict[str, str] = getattr(cls, "PROTOCOL_NAMES", {})
    assert set(renames) <= {f.name for f in dataclasses.fields(cls)}, renames


@pytest.mark.parametrize(("cls", "definition"), TYPED, ids=[d for _, d in TYPED])
def test_a_reply_the_schema_accepts_parses(cls: type[Any], definition: str) -> None:
    """A reply made of exactly the schema's required fields parses, and is valid."""
    props = schema()["$defs"][definition]["properties"]
    required = schema()["$defs"][definition]["required"]
    samples = {"integer": 1, "number": 1.5, "boolean": True, "string": "x", "array": []}
    reply: dict[str, Any] = {}
    for name in required:
        p = props[name]
        kind = p.get("type")
        kind = kind[0] if isinstance(kind, list) else kind
        if "const" in p:
            reply[name] = p["const"]
        elif name == "ok":
            reply[name] = True
        elif name == "decision":
            reply[name] = "repeat"
        elif name == "mountpoint":
            reply[name] = "/m"
        elif name == "staging":
            reply[name] = {"state": "idle"}
        elif name == "v":
            reply[name] = PROTOCOL_VERSION
        elif {"type": "null"} in p.get("anyOf", []):
            reply[name] = None
        else:
            reply[name] = samples.get(kind or "string", "x")
    validator(definition).validate(reply)
    if cls is Decision:
        parsed = Decision.from_response(reply, "pass_end")
    else:
        parsed = cls.from_response(reply)
    for attr, name in protocol_fields(cls).items():
        if name in reply and attr != "files":
            assert getattr(parsed, attr) == reply[name], (attr, name)


def test_replay_reads_exactly_the_schemas_replay() -> None:
    """``Status.replay`` (:class:`Replay`) has every field of the schema's ``Replay``, all
    required there, and reads a valid one back; a malformed one is refused."""
    definition = schema()["$defs"]["Replay"]
    fields = {f.name for f in dataclasses.fields(Replay)}
    assert fields == set(definition["properties"]) == set(definition["required"]), fields
    replay: dict[str, Any] = {
        "run": 2,
        "mini_epochs": 40,
        "why": "best",
        "metric": "min:val_loss",
        "value": 0.2,
        "finished": False,
        "compared": 3,
    }
    validator("Replay").validate(replay)
    assert Replay.from_response(replay) == Replay(**replay)
    latest: dict[str, Any] = {**replay, "why": "latest", "value": None, "compared": 0}
    validator("Replay").validate(latest)
    assert Replay.from_response(latest) == Replay(**latest)
    assert Replay.from_response(None) is None
    bad_ones: list[Any] = [
        {**replay, "why": 1},
        {**replay, "run": "2"},
        {**replay, "finished": None},
        [],
    ]
    for bad in bad_ones:
        with pytest.raises(metfs.MetfsError, match="replay") as e:
            Replay.from_response(bad)
        assert e.value.code == "bad_response"


def test_a_reply_of_another_major_version_is_refused(fake: FakeDaemon) -> None:
    fake.reply_version = 2
    with pytest.raises(metfs.MetfsError) as e:
        metfs.Client(fake.path).status()
    assert e.value.code == "unsupported_version"
    assert "version 2" in e.value.message and "version 1" in e.value.message, e.value.message
    # This version, or none (a daemon older than the field): read as usual.
    for v in (PROTOCOL_VERSION, None):
        fake.reply_version = v
        with metfs.Client(fake.path) as c:
            assert c.status().epoch == 0
    with pytest.raises(metfs.MetfsError, match="version True"):
        check_version({"v": True}, "a reply")


def test_every_request_carries_the_version(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path, job="j") as c:
        c.status()
        c.pass_end({"loss": 1.0})
        c.advance()
        c.files()
    check = validator("RequestLine")
    assert fake.requests
    for req in fake.requests:
        assert req["v"] == PROTOCOL_VERSION, req
        check.validate(req)
