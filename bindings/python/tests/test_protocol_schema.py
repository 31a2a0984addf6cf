"""The client's request and reply types against the protocol's JSON schema, and the version rule.

``docs/protocol.schema.json`` is generated from the daemon's Rust types (a Rust test fails when
it is stale). The Python types are written by hand (:mod:`metfs.protocol`, :mod:`metfs.replies`,
:mod:`metfs.status`, :mod:`metfs.views`, :mod:`metfs.errors`) and compared here with the schema,
field by field and through every nested object:

- the same field names (a dataclass's ``PROTOCOL_NAMES`` renames, its ``DERIVED`` fields are
  computed by the client, its ``WIRE_ONLY`` fields read and not kept);
- the same value types: ``int`` for integers, ``float`` for numbers, ``str``, ``bool``, lists,
  maps, nested objects, ``None`` where the schema allows null, and a ``Literal`` of exactly the
  schema's values for each closed set (``ErrorCode``, the decision, ``op``, ...);
- the same required fields: in a reply, a field without a default is one the schema requires
  and gives no default, and a default is the schema's; in a request, a key is required exactly
  where the schema requires it (a request may leave out a key rather than send null).

A change on either side fails here until the other follows. Real replies are validated against
the schema in ``test_protocol_replies.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import jsonschema
import pytest
from fake_daemon import FakeDaemon, status_reply

import metfs
from metfs import protocol
from metfs.errors import ClientErrorCode, ErrorBody, ErrorCode
from metfs.protocol import PROTOCOL_VERSION, check_version
from metfs.replies import Decision, Hello, Left, NotResumed, Released, Replay
from metfs.status import Status
from metfs.views import FilesReply, FilesView

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_PATH = os.path.join(HERE, "..", "..", "..", "docs", "protocol.schema.json")

#: Each typed reply (or part of one) and the schema definition it reads.
TYPED = [
    (Hello, "HelloReply"),
    (Status, "StatusReply"),
    (FilesReply, "FilesViewReply"),
    (FilesView, "FilesViewReply"),
    (Decision, "DecisionReply"),
    (Released, "ReleasedReply"),
    (Left, "LeftReply"),
    (NotResumed, "NotResumed"),
    (Replay, "Replay"),
    (ErrorBody, "ErrorBody"),
]

#: Every reply carries these; the transport reads them (``check_version``, ``ok``).
ENVELOPE = frozenset({"v", "ok"})
NULL = {"type": "null"}
SCALARS = {"integer": int, "number": float, "string": str, "boolean": bool}


def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH) as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


DEFS: dict[str, Any] = schema()["$defs"]


def validator(definition: str) -> Any:
    """A validator of one message kind (``$defs`` name) of the protocol's schema."""
    s = schema()
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    return cls({"$ref": f"#/$defs/{definition}", "$defs": s["$defs"]})


# -- the comparison ------------------------------------------------------------------------------


def deref(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = DEFS[node["$ref"].rsplit("/", 1)[1]]
    return node


def split_schema(node: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(whether the node allows null, the node without null)."""
    node = deref(node)
    if "anyOf" in node:
        arms = [a for a in node["anyOf"] if a != NULL]
        nullable = len(arms) < len(node["anyOf"])
        return nullable, deref(arms[0]) if len(arms) == 1 else {"anyOf": arms}
    kind = node.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return "null" in kind, {**node, "type": rest[0] if len(rest) == 1 else rest}
    return False, node


def split_py(tp: Any) -> tuple[bool, Any]:
    """(whether the type allows None, the type without None)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = get_args(tp)
        rest = tuple(a for a in args if a is not type(None))
        return len(rest) < len(args), rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007
    return False, tp


def consts(node: dict[str, Any]) -> set[Any] | None:
    """The closed set of values a node allows, if it is one."""
    if "const" in node:
        return {node["const"]}
    if "enum" in node:
        return set(node["enum"])
    if "oneOf" in node and all("const" in deref(a) for a in node["oneOf"]):
        return {deref(a)["const"] for a in node["oneOf"]}
    return None


def arms(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def compare(tp: Any, node: dict[str, Any], where: str, request: bool) -> list[str]:
    """How the Python type ``tp`` differs from the schema ``node`` (nothing: they agree)."""
    s_null, s = split_schema(node)
    p_null, p = split_py(tp)
    if s_null != p_null and not (request and s_null):
        return [f"{where}: null {'allowed' if s_null else 'refused'} by the schema, not Python"]
    if not s or set(s) <= {"description", "default"}:  # any JSON value
        ok = p is Any or (get_origin(p) is dict and get_args(p) == (str, Any))
        return [] if ok else [f"{where}: any JSON in the schema, {p} in Python"]
    closed = consts(s)
    if closed is not None:
        if get_origin(p) is not Literal or set(get_args(p)) != closed:
            return [f"{where}: the schema's values {sorted(closed)}, Python's {p}"]
        return []
    kind = s.get("type")
    if kind in SCALARS:
        return [] if p is SCALARS[kind] else [f"{where}: {kind} in the schema, {p} in Python"]
    origin = get_origin(p)
    if kind == "array":
        if origin not in (list, tuple) and getattr(origin, "__name__", "") != "Sequence":
            return [f"{where}: an array in the schema, {p} in Python"]
        return compare(get_args(p)[0], s["items"], f"{where}[]", request)
    if kind == "object" and "properties" not in s:
        if origin is not dict or get_args(p)[0] is not str:
            return [f"{where}: a map in the schema, {p} in Python"]
        return compare(get_args(p)[1], s["additionalProperties"], f"{where}{{}}", request)
    if kind == "object":
        return compare_object(p, s, where, request)
    if "oneOf" in s:
        return compare_union(p, s["oneOf"], where, request)
    return [f"{where}: the schema's {s} is not compared"]


def compare_union(tp: Any, alternatives: list[Any], where: str, request: bool) -> list[str]:
    """A ``oneOf`` of objects told apart by a constant field, against a union of classes."""
    py_arms = list(arms(tp))
    out: list[str] = []
    if len(py_arms) != len(alternatives):
        out.append(f"{where}: {len(alternatives)} alternatives in the schema, {tp} in Python")
    for alt in alternatives:
        alt = deref(alt)
        key, value = next((k, v["const"]) for k, v in alt["properties"].items() if "const" in v)
        match = [a for a in py_arms if get_type_hints(a).get(key) == Literal[value]]
        if len(match) != 1:
            out.append(f"{where}: no Python class has {key} = {value!r}")
            continue
        out += compare_object(match[0], alt, f"{where}<{value}>", request)
    return out


def py_fields(cls: Any) -> dict[str, tuple[Any, bool, Any]]:
    """A class's protocol fields: wire name -> (type, required, default)."""
    hints = get_type_hints(cls)
    if is_typeddict(cls):
        return {k: (t, k in cls.__required_keys__, dataclasses.MISSING) for k, t in hints.items()}
    assert dataclasses.is_dataclass(cls), cls
    renames: dict[str, str] = getattr(cls, "PROTOCOL_NAMES", {})
    derived: frozenset[str] = getattr(cls, "DERIVED", frozenset())
    out: dict[str, tuple[Any, bool, Any]] = {}
    for f in dataclasses.fields(cls):
        if f.name == "raw" or f.name in derived:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        out[renames.get(f.name, f.name)] = (hints[f.name], default is dataclasses.MISSING, default)
    return out


#: The (class, schema object) pairs being compared: a recursive type (a ``learned`` reason's
#: ``fallback`` is a reason) is compared once.
_COMPARING: set[tuple[int, int]] = set()


def compare_object(cls: Any, node: dict[str, Any], where: str, request: bool) -> list[str]:
    """A dataclass or ``TypedDict`` against an object of the schema, field by field."""
    if not (is_typeddict(cls) or dataclasses.is_dataclass(cls)):
        return [f"{where}: an object in the schema, {cls} in Python"]
    key = (id(cls), id(node))
    if key in _COMPARING:
        return []
    _COMPARING.add(key)
    try:
        return _compare_fields(cls, node, where, request)
    finally:
        _COMPARING.discard(key)


def _compare_fields(cls: Any, node: dict[str, Any], where: str, request: bool) -> list[str]:
    props = {k: v for k, v in node["properties"].items() if k not in ENVELOPE}
    wire_only: frozenset[str] = getattr(cls, "WIRE_ONLY", frozenset())
    required = set(node.get("required", ()))
    ours = py_fields(cls)
    out: list[str] = []
    if set(ours) != set(props) - wire_only:
        out.append(
            f"{where} ({cls.__name__}): only in Python {sorted(set(ours) - set(props))}, "
            f"only in the schema {sorted(set(props) - wire_only - set(ours))}"
        )
    for name in sorted(set(ours) & set(props)):
        tp, py_required, default = ours[name]
        prop = props[name]
        at = f"{where}.{name}"
        out += compare(tp, prop, at, request)
        if request:
            schema_required = name in required
        else:
            schema_required = name in required and "default" not in prop
            # A TypedDict has no defaults: an absent key is absent.
            has_default = not py_required and default is not dataclasses.MISSING
            if "default" in prop and has_default and default != prop["default"]:
                out.append(f"{at}: default {prop['default']!r} in the schema, {default!r} here")
        if py_required != schema_required:
            out.append(
                f"{at}: {'required' if schema_required else 'optional'} in the schema, "
                f"{'required' if py_required else 'optional'} in Python"
            )
    return out


# -- the tests -----------------------------------------------------------------------------------


def test_the_schema_is_this_clients_version() -> None:
    s = schema()
    assert s["version"] == PROTOCOL_VERSION
    assert s["$defs"]["Version"]["const"] == PROTOCOL_VERSION


@pytest.mark.parametrize(("cls", "definition"), TYPED, ids=[c.__name__ for c, _ in TYPED])
def test_every_reply_type_is_the_schemas(cls: type[Any], definition: str) -> None:
    differences = compare_object(cls, DEFS[definition], definition, request=False)
    assert not differences, "\n".join(differences)


def test_every_request_type_is_the_schemas() -> None:
    """One ``TypedDict`` per request of the schema's ``RequestLine`` (told apart by ``op``), the
    same fields and types, required where the schema requires them."""
    differences = compare_union(
        protocol.Request, DEFS["RequestLine"]["oneOf"], "RequestLine", request=True
    )
    assert not differences, "\n".join(differences)


def test_error_codes_are_the_schemas_closed_set() -> None:
    assert set(get_args(ErrorCode)) == consts(DEFS["ErrorCode"])
    assert not set(get_args(ClientErrorCode)) & set(get_args(ErrorCode))


def test_the_comparison_finds_a_difference() -> None:
    """The comparison is not vacuous: a renamed, retyped or newly optional field is told."""

    @dataclasses.dataclass
    class Wrong:
        job: str
        reason: int  # a string in the schema
        epoch: int | None  # never null there
        mini_epoch: int = 0  # required there
        passed: int = 0  # `passes` there

    told = "\n".join(compare_object(Wrong, DEFS["NotResumed"], "NotResumed", request=False))
    for needle in ("only in Python ['passed']", "['passes']", ".reason", ".epoch", ".mini_epoch"):
        assert needle in told, told


def test_every_request_builder_makes_a_valid_request() -> None:
    check = validator("RequestLine")
    made = [
        protocol.hello_request(
            "j", subset={"fraction": 0.5, "seed": 3}, rf_policy="score", rf=2, token="t"
        ),
        protocol.hello_request(),
        protocol.leave_request("j"),
        protocol.status_request("j"),
        protocol.files_request("j", known_generation=3, direct=True),
        protocol.files_request(form="list"),
        protocol.release_request(2),
        protocol.pass_end_request("j", {"loss": 1.0}, block=True, progress=0.5, fresh_loss=2.0),
        protocol.advance_request("j", wait=True),
        protocol.apply_request("j", 1, 2, wait=False),
        protocol.shutdown_request(),
    ]
    for req in made:
        check.validate({"v": PROTOCOL_VERSION, **req})
    # The job goes in the same way into every request that has one.
    assert [r.get("job") for r in made if r["op"] not in ("release", "shutdown")] == [
        "j", None, "j", "j", "j", None, "j", "j", "j"
    ]  # fmt: skip


def sample(node: dict[str, Any], name: str) -> Any:
    """A value of a required property, as small as the schema allows."""
    nullable, s = split_schema(node)
    if nullable:
        return None
    closed = consts(s)
    if closed is not None:
        return min(closed)
    kind = s.get("type")
    if kind == "object" and "properties" in s:
        return {k: sample(s["properties"][k], k) for k in s.get("required", ())}
    if "oneOf" in s:
        return sample(s["oneOf"][0], name)
    return {"integer": 1, "number": 1.5, "boolean": True, "string": "x", "array": []}.get(
        kind or "string", {}
    )


@pytest.mark.parametrize(("cls", "definition"), TYPED[:7], ids=[c.__name__ for c, _ in TYPED[:7]])
def test_a_reply_the_schema_accepts_parses(cls: type[Any], definition: str) -> None:
    """A reply made of exactly the schema's required fields parses, and is valid."""
    d = DEFS[definition]
    reply: dict[str, Any] = {name: sample(d["properties"][name], name) for name in d["required"]}
    reply.update(ok=True, v=PROTOCOL_VERSION)
    if "mountpoint" in reply:
        reply["mountpoint"] = "/m"
    validator(definition).validate(reply)
    parsed = (
        Decision.from_response(reply, "pass_end")
        if cls is Decision
        else metfs.replies.read_reply(cls, reply, definition)
    )
    for name in py_fields(cls):
        attr = {v: k for k, v in getattr(cls, "PROTOCOL_NAMES", {}).items()}.get(name, name)
        if name in reply and hasattr(parsed, attr):
            assert getattr(parsed, attr) == reply[name], (attr, name)


def test_a_reply_missing_or_mistyping_a_field_is_refused() -> None:
    full = status_reply()
    assert metfs.Status.from_response(full).staging == {"state": "idle"}
    for broken, needle in [
        ({k: v for k, v in full.items() if k != "compose"}, "no field `compose`"),
        ({**full, "epoch": "0"}, "malformed `epoch`"),
        ({**full, "rf": True}, "malformed `rf`"),
        ({**full, "staging": {"state": "staging"}}, "malformed `staging`"),
        ({**full, "draining": [{"generation": 1}]}, "`draining[0].slot`"),
        ({**full, "jobs": [{"name": "a"}]}, "`jobs[0].epoch`"),
        ({**full, "failed_samples": ["a/b: gone"]}, "malformed `failed_samples[0]`"),
        ({**full, "failed_samples": [{"path": "a/b"}]}, "`failed_samples[0].reason`"),
        ({**full, "read_path": "auto"}, "malformed `read_path`"),
        ({**full, "rf_policy": "lstm"}, "malformed `rf_policy`"),
    ]:
        with pytest.raises(metfs.MetfsError) as e:
            metfs.Status.from_response(broken)
        assert e.value.code == "bad_response" and needle in e.value.message, e.value.message
    # A field the protocol gives a default may be absent, and takes it.
    older = {k: v for k, v in full.items() if k not in ("effective_rf", "daemon_bytes_spliced")}
    st = metfs.Status.from_response(older)
    assert st.effective_rf is None and st.daemon_bytes_spliced == 0
    # Each failed sample is a record of its path and why.
    failed = [{"path": "a/b", "reason": "gone"}]
    st = metfs.Status.from_response({**full, "failed_samples": failed})
    assert st.failed_samples == failed and st.failed_samples[0]["reason"] == "gone"
    # Integers are numbers; fields this client does not know are kept, in `raw`.
    st = metfs.Status.from_response({**full, "rf": 3, "newer_field": 1})
    assert st.rf == 3.0 and isinstance(st.rf, float) and st["newer_field"] == 1


def test_replay_reads_exactly_the_schemas_replay() -> None:
    """``Status.replay`` (:class:`Replay`) reads a valid one back; a malformed one is refused."""
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
        {**replay, "why": "newest"},
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


def test_every_request_carries_the_version_and_the_job(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path, job="j") as c:
        c.status()
        c.pass_end({"loss": 1.0})
        c.advance()
        c.files()
        c.apply(0, 1)
    check = validator("RequestLine")
    assert fake.requests
    for req in fake.requests:
        assert req["v"] == PROTOCOL_VERSION, req
        assert req["job"] == "j", req
        check.validate(req)


def test_each_policys_reason_is_the_schemas_and_reads_back() -> None:
    """A reason of each shape is valid against the schema and reads back as sent; one of an
    unknown policy, or missing a field its policy always sends, is refused."""
    fixed = {"policy": "fixed", "rf": 2, "passes": 1}
    reasons: list[dict[str, Any]] = [
        fixed,
        {**fixed, "bound": "rf_max", "rf_min": 1, "rf_max": 2},
        {"policy": "score", "best": 0.5, "current": 0.75, "improved": False, "wait": 1,
         "wait_th": 2, "best_scope": "run", "passes": 3},
        {"policy": "bollinger", "filling": True, "have": 2, "current": 1.0, "window": 5,
         "k": 2.0, "window_scope": "per_mini_epoch", "passes": 2},
        {"policy": "bollinger", "ma": 1.0, "std": 0.5, "lower": 0.0, "upper": 2.0,
         "current": 1.5, "window": 5, "k": 2.0, "window_scope": "run", "side": "below",
         "spread": "sample", "current_point": "excluded", "passes": 4},
        {"policy": "learned", "source": "history", "sequence": 0, "rf": 3, "passes": 1,
         "schedule_len": 4},
        {"policy": "learned", "source": "fallback", "sequence": 5, "schedule_len": 4,
         "fallback": fixed},
        {"policy": "paced", "why": "held_out", "cap": 4, "progress": 0.5, "next_ready": True,
         "stall_free_rf": None, "passes": 2,
         "held_out": {"rule": "val_loss", "gain": 0.1, "need": None, "fresh_gain": 0.2}},
        {"policy": "paced", "why": "cap", "cap": 2, "progress": None, "next_ready": None,
         "stall_free_rf": 1, "held_out": None, "passes": 2},
    ]  # fmt: skip
    check = validator("Reason")
    position = {"ok": True, "decision": "repeat", "generation": 1, "epoch": 0, "mini_epoch": 0,
                "mini_epochs": 2, "pass": 1, "rf": 2.0, "next_ready": False}  # fmt: skip
    for reason in reasons:
        check.validate(reason)
        assert Decision.from_response({**position, "reason": reason}, "pass_end").reason == reason
    assert Decision.from_response(position, "advance").reason is None
    for bad in [{"policy": "lstm"}, {"policy": "fixed", "rf": 2}, {**fixed, "bound": "rf"}]:
        with pytest.raises(metfs.MetfsError, match="reason") as e:
            Decision.from_response({**position, "reason": bad}, "pass_end")
        assert e.value.code == "bad_response"
