"""`resident_code` (decision 0040): a started server maps every page of its binary's
read-only segments, so no call pages its code back in from disk after the page cache is
dropped; `--resident-code=false` leaves them to the kernel's demand paging."""
import os
import time

import pytest


def exe_mappings(pid):
    """(size kB, resident kB) summed over the read-only mappings of the process's binary."""
    exe = os.readlink(f"/proc/{pid}/exe")
    size = rss = 0
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                path = line.split(None, 5)[5].strip() if len(fields) >= 6 else ""
                current = path == exe and fields[1][1] == "-"
            elif current and fields[0] == "Size:":
                size += int(fields[1])
            elif current and fields[0] == "Rss:":
                rss += int(fields[1])
    return size, rss


def resident_share(server, settle=20.0):
    """The resident share of the binary's read-only mappings, once it stops growing."""
    deadline = time.monotonic() + settle
    share = 0.0
    while time.monotonic() < deadline:
        size, rss = exe_mappings(server.proc.pid)
        assert size > 0, "no read-only mapping of the server binary found in smaps"
        share = rss / size
        if share > 0.99:
            break
        time.sleep(0.2)
    return share


def test_the_binary_is_resident_by_default(start_server, fixture_dir):
    server = start_server(fixture_dir, extra=["--http-listen", "off"])
    share = resident_share(server)
    assert share > 0.99, f"only {share:.0%} of the binary's code and constants are mapped"


def test_resident_code_false_leaves_paging_to_the_kernel(start_server, fixture_dir):
    server = start_server(fixture_dir, extra=["--http-listen", "off", "--resident-code=false"])
    time.sleep(1.0)
    size, rss = exe_mappings(server.proc.pid)
    # A started server touches a small part of its code; most of it is never mapped.
    assert rss < size * 0.6, f"{rss} of {size} kB mapped without --resident-code"
