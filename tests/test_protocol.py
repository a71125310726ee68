"""Framing, message shapes and op models of the agent protocol."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forkpoint.protocol import (
    MAX_FRAME_BYTES,
    SYNC,
    SYNC_MAGIC,
    BadArguments,
    Event,
    EventKind,
    ExecArgs,
    ExecResult,
    FrameDecoder,
    ListDirResult,
    ProtocolError,
    Response,
    RestoreIdentityArgs,
    encode_frame,
    error_message,
    event_message,
    from_wire,
    ok_message,
    parse_reply,
    parse_request,
    to_wire,
)


def drain(dec: FrameDecoder, limit: int = 100_000) -> list[object]:
    """Everything the decoder yields now (ProtocolErrors as values)."""
    out: list[object] = []
    for _ in range(limit):
        try:
            item = dec.next()
        except ProtocolError as e:
            out.append(e)
            continue
        if item is None:
            return out
        out.append(item)
    raise AssertionError("decoder did not converge (hang)")


def raw_frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


MESSAGES = [
    {"id": 1, "op": "hello", "args": {"nonce": "x", "protocol_version": 1}},
    {"id": 2, "ok": True, "result": {"ünïcode": "✓", "n": [1, 2.5, None, True]}},
    {"id": 3, "ok": False, "error": {"code": "not_found", "message": "nope"}},
]


def test_round_trip_whole_and_byte_by_byte() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    dec = FrameDecoder()
    dec.feed(stream)
    assert drain(dec) == MESSAGES
    dec = FrameDecoder()
    got: list[object] = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        got += drain(dec)
    assert got == MESSAGES


def test_encode_refuses_oversized_and_nan() -> None:
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        encode_frame({"x": "a" * 100}, max_frame=50)
    with pytest.raises(ProtocolError, match="JSON"):
        encode_frame({"x": float("nan")})
    with pytest.raises(ProtocolError, match="JSON"):
        encode_frame({"x": object()})


def test_next_valid_skips_malformed_frames_and_keeps_the_rest() -> None:
    dec = FrameDecoder(max_frame=64 * 1024)
    oversized = struct.pack(">I", 100_000) + b" " * 100_000
    dec.feed(raw_frame(b"not json") + struct.pack(">I", 0) + oversized + encode_frame(MESSAGES[0]))
    assert dec.next_valid() == MESSAGES[0]
    assert dec.next_valid() is None


def test_decoder_errors_are_clear_and_recoverable() -> None:
    good = encode_frame(MESSAGES[0])
    oversized = struct.pack(">I", 100_000) + b"{" + b" " * 99_998 + b"}"
    stream = (
        raw_frame(b"not json")
        + raw_frame(b"[1, 2]")
        + raw_frame(b"\xff\xfe")
        + raw_frame(b'{"a": NaN}')
        + raw_frame(b"[" * 50_000)
        + struct.pack(">I", 0)
        + oversized
        + good
    )
    dec = FrameDecoder(max_frame=64 * 1024)
    dec.feed(stream)
    items = drain(dec)
    errors = [str(e) for e in items if isinstance(e, ProtocolError)]
    assert len(errors) == 7
    assert "not valid JSON" in errors[0]
    assert "JSON object" in errors[1]
    assert "UTF-8" in errors[2]
    assert "non-finite" in errors[3] or "JSON" in errors[3]
    assert "nested too deeply" in errors[4] or "JSON" in errors[4]
    assert "empty frame" in errors[5]
    assert "exceeds the maximum of 65536" in errors[6]
    assert items[-1] == MESSAGES[0]


def test_oversized_frame_is_skipped_without_buffering() -> None:
    dec = FrameDecoder(max_frame=1024)
    dec.feed(struct.pack(">I", 10 * 1024 * 1024) + b"j" * 100)
    with pytest.raises(ProtocolError, match="exceeds"):
        dec.next()
    for _ in range(100):  # 6.4 MB of junk goes by, the buffer stays tiny
        dec.feed(b"j" * 64 * 1024)
        assert dec.next() is None
        assert len(dec._buf) < 64
    dec.feed(b"j" * (10 * 1024 * 1024 - 100 * 64 * 1024 - 100) + encode_frame({"ok": 1}))
    assert drain(dec) == [{"ok": 1}]


def test_sync_marker_resets_partial_frames() -> None:
    good = encode_frame(MESSAGES[0])
    dec = FrameDecoder(require_sync=True)
    dec.feed(b"garbage before the first sync" + good[:7])
    assert drain(dec) == []
    dec.feed(SYNC_MAGIC + good)
    assert drain(dec) == [SYNC, MESSAGES[0]]
    # A frame cut off by a resync (host reconnected mid-send) is dropped silently.
    dec.feed(good[:10])
    dec.feed(SYNC_MAGIC[:5])
    assert drain(dec) == []
    dec.feed(SYNC_MAGIC[5:] + good)
    assert drain(dec) == [SYNC, MESSAGES[0]]
    # Inside an oversized frame being skipped, too.
    dec = FrameDecoder(max_frame=16)
    dec.feed(struct.pack(">I", 10_000) + b"x" * 100 + SYNC_MAGIC + good)
    assert isinstance(drain(dec)[0], ProtocolError)
    dec2 = FrameDecoder(max_frame=1024)
    dec2.feed(struct.pack(">I", 10_000) + b"x" * 100 + SYNC_MAGIC + good)
    assert drain(dec2)[-2:] == [SYNC, MESSAGES[0]]


def test_reset_forgets_everything() -> None:
    dec = FrameDecoder()
    dec.feed(encode_frame(MESSAGES[0])[:9])
    dec.reset(require_sync=False)
    dec.feed(encode_frame(MESSAGES[1]))
    assert drain(dec) == [MESSAGES[1]]


def test_message_parsing() -> None:
    req = parse_request({"id": 7, "op": "exec", "args": {"shell": "true"}})
    assert (req.id, req.op, req.args) == (7, "exec", {"shell": "true"})
    for bad in (
        {"op": "x"},
        {"id": "1", "op": "x"},
        {"id": True, "op": "x"},
        {"id": -1, "op": "x"},
        {"id": 1, "op": ""},
        {"id": 1, "op": "x", "args": []},
        {"id": 1, "op": "x", "extra": 1},
    ):
        with pytest.raises(ProtocolError):
            parse_request(bad)
    assert parse_reply(ok_message(1, {"a": 1})) == Response(1, result={"a": 1})
    err = parse_reply(error_message(None, "not_found", "gone"))
    assert err.id is None and err.error is not None and err.error.code == "not_found"
    ev = parse_reply(event_message(3, EventKind.STDOUT, b"\x00\xff"))
    assert ev == Event(3, EventKind.STDOUT, b"\x00\xff")
    bad_replies: list[dict[str, object]] = [
        {"id": 1},
        {"id": 1, "ok": True},
        {"id": 1, "ok": False, "error": "x"},
        {"id": 1, "event": "nope", "data": ""},
        {"id": 1, "event": "chunk", "data": "!!"},
    ]
    for bad_reply in bad_replies:
        with pytest.raises(ProtocolError):
            parse_reply(bad_reply)


def test_models_round_trip_and_validate() -> None:
    args = ExecArgs(argv=["echo", "hi"], env={"A": "1"}, stdin=b"\x00data", timeout=2)
    wire = json.loads(json.dumps(to_wire(args)))
    assert wire["stdin"] == base64.b64encode(b"\x00data").decode()
    assert from_wire(ExecArgs, wire) == args
    res = ExecResult(1, None, b"o", b"e", False, 1.5, 42)
    assert from_wire(ExecResult, to_wire(res)) == res
    listing = {"entries": [{"name": "a", "type": "file", "size": 1, "mode": 420, "mtime_ns": 5}]}
    assert from_wire(ListDirResult, listing).entries[0].name == "a"
    bad_args: list[dict[str, object]] = [
        {},  # neither argv nor shell
        {"argv": [], "shell": None},
        {"argv": ["a"], "shell": "b"},
        {"shell": "x", "cwd": "relative"},
        {"shell": "x", "timeout": -1},
        {"shell": "x", "timeout": True},
        {"shell": "x", "stdin": "not base64!"},
        {"shell": "x", "env": {"A=B": "c"}},
        {"shell": "x", "bogus": 1},
        {"shell": 5},
        {"argv": ["a", 1]},
    ]
    for bad_arg in bad_args:
        with pytest.raises(BadArguments):
            from_wire(ExecArgs, bad_arg)
    ok = {"time_ns": 1_700_000_000 * 10**9, "entropy": base64.b64encode(b"e" * 64).decode()}
    assert from_wire(RestoreIdentityArgs, {**ok, "hostname": "fork-1.local"}).hostname
    for bad in (
        {**ok, "time_ns": 5},
        {**ok, "entropy": base64.b64encode(b"short").decode()},
        {**ok, "hostname": "bad host!"},
        {**ok, "hostname": "-x"},
    ):
        with pytest.raises(BadArguments):
            from_wire(RestoreIdentityArgs, bad)


# -- fuzzing -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def hostile_streams(draw: st.DrawFn) -> list[bytes]:
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 6))
        if kind == 0:
            parts.append(draw(st.binary(max_size=64)))
        elif kind == 1:  # a valid frame, maybe truncated
            frame = encode_frame({"v": draw(json_values)})
            parts.append(frame[: draw(st.integers(0, len(frame)))])
        elif kind == 2:  # a lying / oversized length
            parts.append(struct.pack(">I", draw(st.integers(0, 2**32 - 1))))
        elif kind == 3:  # non-JSON payload
            parts.append(raw_frame(draw(st.binary(min_size=1, max_size=64))))
        elif kind == 4:  # JSON of the wrong type or shape
            parts.append(raw_frame(json.dumps(draw(json_values)).encode()))
        elif kind == 5:
            parts.append(SYNC_MAGIC[: draw(st.integers(0, len(SYNC_MAGIC)))])
        else:
            parts.append(encode_frame({"id": draw(st.integers()), "op": draw(json_values)}))
    return parts


@settings(max_examples=400, deadline=None)
@given(parts=hostile_streams(), require_sync=st.booleans(), cut=st.integers(1, 50))
def test_fuzz_decoder_only_raises_protocol_error(
    parts: list[bytes], require_sync: bool, cut: int
) -> None:
    stream = b"".join(parts)
    dec = FrameDecoder(max_frame=256, require_sync=require_sync)
    for i in range(0, len(stream), cut):
        dec.feed(stream[i : i + cut])
        for item in drain(dec):
            if isinstance(item, dict):
                for parse in (parse_request, parse_reply):
                    try:
                        parse(item)
                    except ProtocolError:
                        pass
        assert len(dec._buf) <= 256 + 4 + cut + len(SYNC_MAGIC)
    # After a sync marker, the decoder is always usable again.
    dec.feed(SYNC_MAGIC + encode_frame({"after": True}))
    assert drain(dec)[-2:] == [SYNC, {"after": True}]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048))
def test_fuzz_random_bytes(data: bytes) -> None:
    dec = FrameDecoder()
    dec.feed(data)
    for item in drain(dec):
        assert isinstance(item, dict | ProtocolError) or item is SYNC


@settings(max_examples=200, deadline=None)
@given(obj=json_values)
def test_fuzz_models_only_raise_bad_arguments(obj: object) -> None:
    for model in (ExecArgs, RestoreIdentityArgs, ListDirResult):
        try:
            from_wire(model, obj)
        except BadArguments:
            pass


def test_max_frame_is_large_enough_for_a_full_exec_result() -> None:
    res = ExecResult(0, None, b"\xff" * 1024 * 1024, b"\xff" * 1024 * 1024, True, 1.0, 1)
    assert len(encode_frame(ok_message(1, to_wire(res)))) < MAX_FRAME_BYTES
