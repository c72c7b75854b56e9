#!/usr/bin/env python3
"""coverage_report.py INFO SRCDIR UNHIT_OUT: the per-directory half of `make coverage`.

Reads the lcov tracefile INFO (already limited to src/ and include/) and prints a markdown
table of line and branch coverage per directory (src/<dir>, include). Then finds every
kvs_fail( call in the source files and writes those the suite never executed (the call's
statement has line data and every line of it counts 0) to UNHIT_OUT, and prints their count
per directory: the error paths no test reaches yet.
"""
import collections
import os
import re
import sys


def parse_info(path):
    """{source file: {"da": {line: count}, "lf", "lh", "brf", "brh"}} from an lcov tracefile."""
    files = {}
    cur = None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("SF:"):
                cur = files.setdefault(line[3:], {"da": {}, "lf": 0, "lh": 0, "brf": 0, "brh": 0})
            elif cur is None:
                continue
            elif line.startswith("DA:"):
                num, count = line[3:].split(",")[:2]
                num = int(num)
                cur["da"][num] = max(cur["da"].get(num, 0), int(count))
            elif line.startswith(("LF:", "LH:", "BRF:", "BRH:")):
                key, val = line.split(":", 1)
                cur[key.lower()] += int(val)
            elif line == "end_of_record":
                cur = None
    return files


# Sources whose branch counts measure instantiations, not decisions: gcc emits a copy of each
# force-inlined SIMD template per call site (per weight type and tile shape), and in each copy
# the branches on the type and the shape are constants, so most of their outcomes cannot be
# taken by any input (kernels_internal.h's fp16 gather: 8 conditions on one macro line, 1792
# branches in 224 copies). The report gives the total with and without them.
TEMPLATE_KERNELS = ("src/core/kernels_internal.h", "src/core/matmul_kq.c")


def group(rel):
    """src/core/x.c -> src/core; include/kvslim.h -> include; src/x.c -> src."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return "src/" + parts[1]
    return parts[0]


def pct(hit, found):
    return "-" if found == 0 else "%.1f%%" % (100.0 * hit / found)


def main():
    info, srcdir, unhit_out = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
    files = parse_info(info)

    dirs = collections.OrderedDict()
    total = [0, 0, 0, 0]
    for path in sorted(files):
        rec = files[path]
        d = group(os.path.relpath(path, srcdir))
        acc = dirs.setdefault(d, [0, 0, 0, 0])
        for i, key in enumerate(("lh", "lf", "brh", "brf")):
            acc[i] += rec[key]
            total[i] += rec[key]

    print("| directory | lines hit / found | lines | branches hit / found | branches |")
    print("|---|---:|---:|---:|---:|")
    for d in sorted(dirs):
        lh, lf, bh, bf = dirs[d]
        print("| %s | %d / %d | %s | %d / %d | %s |" % (d, lh, lf, pct(lh, lf), bh, bf, pct(bh, bf)))
    lh, lf, bh, bf = total
    print("| **total** | %d / %d | **%s** | %d / %d | **%s** |" % (lh, lf, pct(lh, lf), bh, bf, pct(bh, bf)))
    tb = [0, 0]
    for path, rec in files.items():
        if os.path.relpath(path, srcdir) in TEMPLATE_KERNELS:
            tb[0] += rec["brh"]
            tb[1] += rec["brf"]
    print("branches outside the template-instantiated kernels (%s): %d / %d = %s" %
          (", ".join(TEMPLATE_KERNELS), bh - tb[0], bf - tb[1], pct(bh - tb[0], bf - tb[1])))

    # kvs_fail( call sites. A call may span lines: its statement runs to the ';' closing it,
    # and gcc may put the line count on any of its lines, so the statement's maximum decides.
    call = re.compile(r"\bkvs_fail\(")
    unhit = collections.defaultdict(list)
    sites = collections.Counter()
    nodata = 0
    for root, _, names in os.walk(os.path.join(srcdir, "src")):
        for name in sorted(names):
            if not name.endswith(".c"):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, srcdir)
            with open(path, errors="replace") as f:
                lines = f.read().split("\n")
            da = files.get(path, {}).get("da", {})
            for i, text in enumerate(lines):
                m = call.search(text)
                stripped = text.strip()
                if not m or stripped.startswith(("*", "/*", "//")) or stripped.startswith("kvs_status kvs_fail("):
                    continue
                span, depth, j, stmt = [], 0, i, ""
                started = False
                while j < len(lines):
                    seg = lines[j][m.start():] if j == i else lines[j]
                    stmt += seg + " "
                    span.append(j + 1)
                    for ch in seg:
                        if ch == "(":
                            depth += 1
                            started = True
                        elif ch == ")":
                            depth -= 1
                    if (started and depth <= 0) or len(span) >= 20:
                        break
                    j += 1
                counts = [da[n] for n in span if n in da]
                d = group(rel)
                sites[d] += 1
                if not counts:
                    nodata += 1
                    continue
                if max(counts) == 0:
                    msg = re.search(r'"((?:[^"\\]|\\.)*)"', stmt)
                    unhit[d].append("%s:%d: %s" % (rel, i + 1, (msg.group(1) if msg else stmt.strip())[:70]))

    n_unhit = sum(len(v) for v in unhit.values())
    with open(unhit_out, "w") as out:
        out.write("# kvs_fail( call sites the test suite never executes (make coverage)\n")
        out.write("# %d of %d call sites; per directory: unhit / sites\n" % (n_unhit, sum(sites.values())))
        for d in sorted(sites):
            out.write("#   %-16s %4d / %d\n" % (d, len(unhit[d]), sites[d]))
        for d in sorted(unhit):
            out.write("\n## %s (%d)\n" % (d, len(unhit[d])))
            for entry in unhit[d]:
                out.write(entry + "\n")

    print()
    print("kvs_fail( call sites never executed: %d of %d (%s)" % (n_unhit, sum(sites.values()), unhit_out))
    print("| directory | unhit | sites |")
    print("|---|---:|---:|")
    for d in sorted(sites):
        print("| %s | %d | %d |" % (d, len(unhit[d]), sites[d]))
    if nodata:
        print("(%d call sites have no line data: compiled out)" % nodata)


if __name__ == "__main__":
    main()
