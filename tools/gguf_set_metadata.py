#!/usr/bin/env python3
"""Sets, replaces or removes string metadata keys of a GGUF file, leaving everything else byte-identical.

    python3 tools/gguf_set_metadata.py models/target.gguf --set-file tokenizer.chat_template models/chat_template.jinja
    python3 tools/gguf_set_metadata.py in.gguf -o out.gguf --set general.name tiny --remove general.url

Only the key/value section changes: the other key/values are copied as their original bytes, in order (a
replaced key keeps its place, a new one is appended), the tensor infos are copied as they are (their offsets
are relative to the data section), and the data section is copied byte for byte after the padding to the
file's alignment. The script checks that the output's data section hashes to the input's and writes
atomically (a temporary file renamed over the output). Python standard library only.
"""

import argparse
import hashlib
import os
import struct
import sys
import tempfile

# GGUF value types: fixed sizes of the scalar ones.
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


class Parser:
    def __init__(self, buf, name):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, n):
        if self.pos + n > len(self.buf):
            sys.exit(f"{self.name}: truncated GGUF file (at byte {self.pos})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode("utf-8")

    def skip_value(self, vtype, depth=0):
        if vtype in SCALAR_SIZE:
            self.take(SCALAR_SIZE[vtype])
        elif vtype == STRING:
            self.take(self.u64())
        elif vtype == ARRAY and depth < 4:
            etype, n = self.u32(), self.u64()
            if etype in SCALAR_SIZE:
                self.take(SCALAR_SIZE[etype] * n)
            else:
                for _ in range(n):
                    self.skip_value(etype, depth + 1)
        else:
            sys.exit(f"{self.name}: unknown GGUF value type {vtype} at byte {self.pos}")


def parse(buf, name):
    """(version, n_tensors, [(key, raw kv bytes, value or None)], tensor info bytes, alignment, data offset)."""
    p = Parser(buf, name)
    if p.take(4) != b"GGUF":
        sys.exit(f"{name}: not a GGUF file")
    version = p.u32()
    if version not in (2, 3):
        sys.exit(f"{name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = p.u64(), p.u64()
    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = p.pos
        key = p.string()
        vtype = p.u32()
        vstart = p.pos
        p.skip_value(vtype)
        value = None
        if key == "general.alignment" and vtype == 4:
            alignment = struct.unpack("<I", buf[vstart:vstart + 4])[0]
        if vtype == STRING:
            value = buf[vstart + 8:p.pos].decode("utf-8", "replace")
        kvs.append((key, buf[start:p.pos], value))
    tstart = p.pos
    for _ in range(n_tensors):
        p.string()
        n_dims = p.u32()
        p.take(8 * n_dims + 4 + 8)
    tinfo = buf[tstart:p.pos]
    data = (p.pos + alignment - 1) // alignment * alignment
    if data > len(buf):
        sys.exit(f"{name}: the data section starts past the end of the file")
    return version, n_tensors, kvs, tinfo, alignment, data


def kv_string(key, value):
    k, v = key.encode("utf-8"), value.encode("utf-8")
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", STRING) + struct.pack("<Q", len(v)) + v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("-o", "--output", help="output file (default: replace the input)")
    ap.add_argument("--set", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                    help="set a string key")
    ap.add_argument("--set-file", nargs=2, action="append", default=[], metavar=("KEY", "FILE"),
                    help="set a string key to a UTF-8 file's content")
    ap.add_argument("--remove", action="append", default=[], metavar="KEY", help="remove a key")
    args = ap.parse_args()

    with open(args.input, "rb") as f:
        buf = f.read()
    version, n_tensors, kvs, tinfo, alignment, data = parse(buf, args.input)
    sets = dict(args.set)
    for key, path in args.set_file:
        with open(path, "rb") as f:
            sets[key] = f.read().decode("utf-8")
    for key in list(sets) + args.remove:
        if key == "general.alignment":
            sys.exit("general.alignment cannot be changed by this script")

    out_kvs, seen = [], set()
    for key, raw, _ in kvs:
        seen.add(key)
        if key in args.remove:
            continue
        out_kvs.append(kv_string(key, sets[key]) if key in sets else raw)
    for key, value in sets.items():
        if key not in seen:
            out_kvs.append(kv_string(key, value))

    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(out_kvs)) + b"".join(out_kvs) + tinfo
    pad = (-len(head)) % alignment
    out = head + b"\0" * pad + buf[data:]

    _, _, new_kvs, new_tinfo, _, new_data = parse(out, "the output")
    if new_tinfo != tinfo or hashlib.sha256(out[new_data:]).digest() != hashlib.sha256(buf[data:]).digest():
        sys.exit("internal error: the tensor infos or data changed")
    got = {k: v for k, _, v in new_kvs}
    for key, value in sets.items():
        if got.get(key) != value:
            sys.exit(f"internal error: {key} did not read back")

    dest = args.output or args.input
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dest)), prefix=".gguf_set_")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(out)
        if os.path.exists(dest):
            mode = os.stat(dest).st_mode & 0o7777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"{dest}: {len(kvs)} -> {len(out_kvs)} key/values, {n_tensors} tensors and {len(buf) - data} data "
          f"bytes unchanged, {len(out)} bytes")


if __name__ == "__main__":
    main()
