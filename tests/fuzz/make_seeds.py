#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): one valid input of each shape a target
parses, plus near misses, so the fuzzer starts inside the formats instead of guessing magics. Run from anywhere;
the files are committed, and rerunning this gives the same bytes (no randomness)."""
import os
import struct
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def write(target, name, data):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def frame(kind, tag, length, tensor=0xFFFFFFFFFFFFFFFF):
    # core/comm/frame.h: "TRSF", version 1, kind, flags 0, tag, tensor, length (little-endian)
    return b"TRSF" + struct.pack("<HBBQQQ", 1, kind, 0, tag, tensor, length)


# frame_header: a limit byte, then a header.
for kind in range(6):
    write("frame_header", f"kind{kind}", bytes([0]) + frame(kind, 7 + kind, 100 * kind))
write("frame_header", "over_limit", bytes([40]) + frame(1, 1, 1 << 30))
write("frame_header", "short", bytes([0]) + frame(0, 0, 0)[:20])

# auth_handshake: mode, hello (40), proof (32), challenge (32), proof (32), tcp hello (16), text.
nonce = bytes(range(32))
for mode in (0, 1, 6, 7):
    service = 1 if mode & 1 else 2
    hello = b"TRSA" + struct.pack("<HH", 2, service) + nonce
    tcp_hello = struct.pack("<IHHII", 0x48535254, 1, 5, 1, 3)
    write("auth_handshake", f"mode{mode}", bytes([mode | 6]) + hello + bytes(32) + nonce + bytes(32) + tcp_hello +
          b"host1")
write("auth_handshake", "v1_hello", bytes([2]) + b"TRSA" + struct.pack("<HH", 1, 2) + nonce)
write("auth_handshake", "ack", bytes([6]) + bytes(136) + struct.pack("<IHHII", 0x4B535254, 1, 0, 0, 2))


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    return key + (varint(len(payload)) + payload if wire == 2 else payload)


def request(op, *fields):
    inner = b"".join(fields)
    return field(op, 2, inner)


SET, GET, ADD, CHECK = 1, 2, 3, 4
reqs = {
    "set": request(SET, field(1, 2, b"tcp/addr/0"), field(2, 2, b"127.0.0.1:40000")),
    "get": request(GET, field(1, 2, b"tcp/addr/0"), field(2, 0, varint(1000))),
    "get_missing": request(GET, field(1, 2, b"nope"), field(2, 0, varint(10**12))),
    "add": request(ADD, field(1, 2, b"count"), field(2, 0, varint(5))),
    "add_negative": request(ADD, field(1, 2, b"count"), field(2, 0, varint((1 << 64) - 3))),
    "check": request(CHECK, field(1, 2, b"tcp/host/1")),
    "bad_key": request(SET, field(1, 2, b"bad\x01key"), field(2, 2, b"v")),
}
for name, body in reqs.items():
    write("store_request", "bare_" + name, bytes([1]) + body)
stream = b"".join(frame(5, i + 1, len(b)) + b for i, b in enumerate(
    [reqs["set"], reqs["add"], reqs["add"], reqs["get"], reqs["check"], reqs["get_missing"]]))
write("store_request", "stream", bytes([0]) + stream)
write("store_request", "stream_add_to_text", bytes([0]) + frame(5, 1, len(reqs["set"])) + reqs["set"] +
      frame(5, 2, len(request(ADD, field(1, 2, b"tcp/addr/0"), field(2, 0, varint(1))))) +
      request(ADD, field(1, 2, b"tcp/addr/0"), field(2, 0, varint(1))))

# ps_wire: mode, then a frame. Request: "TPSR", version 1, op, dtype, step, piece, offset, numel, worker_version,
# payload_bytes. Reply: "TPSA", version 1, status, dtype, step, piece, payload_bytes.
def ps_request(op, dtype, payload):
    return struct.pack("<IHBBQQQQQQ", 0x52535054, 1, op, dtype, 3, 1, 0, len(payload) // 4, 2, len(payload)) + payload


write("ps_wire", "push", bytes([0]) + ps_request(1, 0, struct.pack("<4f", 1, 2, 3, 4)))
write("ps_wire", "pull_f16", bytes([0]) + ps_request(2, 1, b""))
for op in (3, 4, 5):
    write("ps_wire", f"op{op}", bytes([0]) + ps_request(op, 0, b""))
write("ps_wire", "reply_ok", bytes([1]) + struct.pack("<IHBBQQQ", 0x41535054, 1, 0, 0, 3, 2, 8) + bytes(8))
write("ps_wire", "reply_error", bytes([1]) + struct.pack("<IHBBQQQ", 0x41535054, 1, 1, 0, 3, 0, 5) + b"oops!")
for m, dt in ((2, "f32"), (5, "f16"), (8, "bf16")):
    size = 4 if dt == "f32" else 2
    write("ps_wire", f"body_{dt}", bytes([m, 2, 1]) + struct.pack("<QQ", 1, 2) + bytes(16 * size))
# Row-sparse frames. Headers of ops 6 (push rows) and 7 (pull rows); then modes 128..255 (ps_wire_fuzz.cc's two-shard
# plan): a row push of rows 1 and 3 of piece 0 (row 3 cut to 3 elements by the shard boundary), a row pull of rows 0
# and 2 from shard 0.
write("ps_wire", "op6", bytes([0]) + ps_request(6, 0, struct.pack("<IIII7f", 2, 4, 1, 3, *range(7))))
write("ps_wire", "op7", bytes([0]) + ps_request(7, 0, struct.pack("<III", 2, 0, 2)))
write("ps_wire", "row_push", bytes([128]) + struct.pack("<IIII7f", 2, 4, 1, 3, *range(7)))
write("ps_wire", "row_pull", bytes([129]) + struct.pack("<III", 2, 0, 2))
# Compressed pulls: a delta pull request (op 8), and a delta pull body (mode 96) of two pieces bounded at 4 and 16
# bytes, with payloads of 3 and 9 bytes padded to 8, and the checksum.
write("ps_wire", "op8", bytes([0]) + ps_request(8, 0, b""))
write("ps_wire", "delta_body", bytes([96, 2, 4, 16]) + struct.pack("<QQ", 7, 8) + struct.pack("<Q", 3) + b"abc" +
      bytes(5) + struct.pack("<Q", 9) + b"abcdefghi" + bytes(7) + struct.pack("<Q", 0x0123456789ABCDEF))


# idx: max_examples byte, split/4 byte, images file, labels file.
def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


images = idx([3, 2, 2], bytes(range(0, 240, 20)))
labels = idx([3], bytes([0, 9, 4]))
write("idx", "three", bytes([0, len(images) // 4]) + images + labels)
write("idx", "three_max2", bytes([2, len(images) // 4]) + images + labels)
write("idx", "bad_label", bytes([0, len(images) // 4]) + images + idx([3], bytes([0, 10, 4])))

# config_text: two small studies; the example studies (experiments/configs) are seeds too, read from where they are
# (tests/fuzz/CMakeLists.txt, scripts/fuzz).
write("config_text", "minimal", b'name: "m" workload { name: "mlp" } workers: 2 epochs: 1\n')
write("config_text", "variants", b'name: "v" workers: 3 link { bandwidth: "1Gbps" latency: "1ms" }\n'
      b'variants { variant: "a" compressor { name: "topk" params { key: "ratio" value: "0.01" } } }\n'
      b'variants { variant: "b" mode: ASYNC parameter_server { servers: 1 } }\n')
# Nesting at the parser's limit (32 messages: experiments/config/limits.h) and one level past it, the shape of the
# input that once overflowed the parser's stack (regressions/config_text/deep_nesting).
write("config_text", "nested_32", b'study: "s"\n' + b'variants { overrides { ' * 16 + b'} } ' * 16 + b'\n')
write("config_text", "nested_34", b'study: "s"\n' + b'variants { overrides { ' * 17 + b'} } ' * 17 + b'\n')
