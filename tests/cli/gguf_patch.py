#!/usr/bin/env python3
"""Copies a GGUF file with some fields overwritten in place, for the resource-limit tests
(tests/cli/resource_limits.sh): the copy claims huge sizes while staying tiny on disk.

usage: gguf_patch.py IN DIR < SPEC, where each line of SPEC is "NAME EDIT..." and writes
DIR/NAME.gguf, a copy of IN with the EDITs applied (one run for all files: Python starts
slowly). An EDIT is one of
  header.tensors=N | header.keys=N         the header's tensor or key count (u64)
  key:NAME=N        a scalar key's value (same width as stored), or for a string key its
                    length, for an array key its element count
  key:NAME[0]=N     the length of a string array's first element
  tensor:NAME.dim0=N | tensor:NAME.dim1=N  a tensor's dimension
  size=N            the file's size afterwards (extended sparsely with zero bytes)
"""
import os
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def parse(b):
    """Offsets of the fields: {'key:NAME': (offset, width)}, {'tensor:NAME.dimI': ...}."""
    f = {'header.tensors': (8, 8), 'header.keys': (16, 8)}
    n_t, n_kv = struct.unpack_from('<QQ', b, 8)
    pos = 24

    def skip(t, pos):
        if t == 8:
            (n,) = struct.unpack_from('<Q', b, pos)
            return pos + 8 + n
        if t == 9:
            et, n = struct.unpack_from('<IQ', b, pos)
            pos += 12
            for _ in range(n):
                pos = skip(et, pos)
            return pos
        return pos + SCALAR[t]

    for _ in range(n_kv):
        (n,) = struct.unpack_from('<Q', b, pos)
        name = b[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (t,) = struct.unpack_from('<I', b, pos)
        pos += 4
        if t == 8:
            f['key:' + name] = (pos, 8)
        elif t == 9:
            f['key:' + name] = (pos + 4, 8)
            f['key:' + name + '[0]'] = (pos + 12, 8)
        else:
            f['key:' + name] = (pos, SCALAR[t])
        pos = skip(t, pos)
    for _ in range(n_t):
        (n,) = struct.unpack_from('<Q', b, pos)
        name = b[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        (nd,) = struct.unpack_from('<I', b, pos)
        pos += 4
        for d in range(nd):
            f['tensor:%s.dim%d' % (name, d)] = (pos + 8 * d, 8)
        pos += 8 * nd + 4 + 8
    return f


def patch(src, b, fields, dst, edits):
    b = bytearray(b)
    size = None
    for e in edits:
        name, _, val = e.rpartition('=')
        v = int(val, 0)
        if name == 'size':
            size = v
            continue
        if name not in fields:
            sys.exit('gguf_patch.py: %s has no field %s' % (src, name))
        off, width = fields[name]
        b[off:off + width] = v.to_bytes(width, 'little')
    with open(dst, 'wb') as out:
        out.write(b)
        if size is not None:
            out.truncate(size)


def main():
    src, outdir = sys.argv[1], sys.argv[2]
    b = open(src, 'rb').read()
    fields = parse(b)
    for line in sys.stdin:
        words = line.split()
        if words:
            patch(src, b, fields, os.path.join(outdir, words[0] + '.gguf'), words[1:])


main()
