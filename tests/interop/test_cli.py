"""The `tessera get|ls|stats` commands of the shipped binary, judged by numpy."""
import subprocess

import numpy as np
import pytest

from conftest import tessera_bin


def run(*args, env=None):
    return subprocess.run(
        [tessera_bin(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("no_mmap", [False, True], ids=["mmap", "socket"])
@pytest.mark.parametrize(
    "name,region,index",
    [
        ("u16_stack", None, np.s_[...]),
        ("u16_stack", "1:5,:,10:77", np.s_[1:5, :, 10:77]),
        ("be_i2", ":,3:40", np.s_[:, 3:40]),
        ("fortran", "2:20,5:6,:", np.s_[2:20, 5:6, :]),
    ],
)
def test_get_writes_what_np_load_reads(start_server, fixture_dir, arrays, tmp_path, name, region, index, no_mmap):
    server = start_server(fixture_dir)
    out = tmp_path / "out.npy"
    args = ["get", server.location, name, "-o", out]
    if region:
        args += ["--region", region]
    if no_mmap:
        args.append("--no-mmap")
    done = run(*args)
    assert done.returncode == 0, done.stderr
    expected = arrays[name][index]
    got = np.load(out)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    route = "0 over the socket" if not no_mmap else "0 mapped"
    assert route in done.stdout, done.stdout


@pytest.mark.parametrize("no_mmap", [False, True], ids=["mmap", "socket"])
@pytest.mark.parametrize(
    "name,region,scale,method",
    [
        ("u16_stack", None, (1, 4, 4), "area"),
        ("u16_stack", "1:5,:,10:77", (2, 3, 4), "nearest"),
        ("be_i2", ":,3:40", (5, 2), "area"),
        ("f32_4d", None, (1, 2, 7, 8), None),
    ],
)
def test_get_scaled_writes_the_reduction(start_server, fixture_dir, arrays, tmp_path, name, region, scale, method, no_mmap):
    from test_scaled_reads import nearest, reduced_window, staged_area

    server = start_server(fixture_dir, extra=("--chunk-target", "6KiB"))
    out = tmp_path / "out.npy"
    args = ["get", server.location, name, "-o", out, "--scale", ",".join(map(str, scale))]
    if method:
        args += ["--method", method]
    if region:
        args += ["--region", region]
    if no_mmap:
        args.append("--no-mmap")
    done = run(*args)
    assert done.returncode == 0, done.stderr
    a = arrays[name]
    whole = staged_area(a, scale) if method == "area" else nearest(a, scale)
    if region:
        sl = tuple(
            slice(int(lo or 0), int(hi) if hi else d)
            for (lo, hi), d in zip((part.split(":") for part in region.split(",")), a.shape)
        )
        whole = whole[reduced_window(sl, scale)]
    got = np.load(out)
    assert got.dtype == a.dtype
    assert got.tobytes() == np.ascontiguousarray(whole).tobytes()


def test_get_refuses_an_unknown_array_and_a_bad_region(start_server, fixture_dir, tmp_path):
    server = start_server(fixture_dir)
    out = tmp_path / "out.npy"
    missing = run("get", server.location, "no_such_array", "-o", out)
    assert missing.returncode != 0
    assert "no_such_array" in missing.stderr
    bad = run("get", server.location, "u16_stack", "--region", "0:2,:,:,:", "-o", out)
    assert bad.returncode != 0
    assert "region" in bad.stderr.lower()
    assert not out.exists()


def test_ls_lists_every_tensor_and_stats_reports_reads(start_server, fixture_dir, arrays, tmp_path):
    server = start_server(fixture_dir)
    listing = run("ls", server.location)
    assert listing.returncode == 0, listing.stderr
    for name, arr in arrays.items():
        line = next((l for l in listing.stdout.splitlines() if l.split()[:1] == [name]), None)
        assert line is not None, listing.stdout
        assert str(arr.dtype.str) in line
    got = run("get", server.location, "u16_stack", "-o", tmp_path / "x.npy")
    assert got.returncode == 0, got.stderr
    stats = run("stats", server.location)
    assert stats.returncode == 0, stats.stderr
    assert "file" in stats.stdout
    assert "misses" in stats.stdout.lower()
