"""An address workers can dial (`--external-location`, `health`'s `external_location`).

The cluster test puts dask workers where a remote node's would be: in a network namespace of
their own, joined to the server's by a veth pair, so the server's loopback is not theirs. The
graph reaches them through the address the server advertises (biopb's `advertised_location`
passed as `export_location`) and the bytes they read are compared with numpy."""
import os
import asyncio
import random
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from biopb.tensor import TensorFlightClient
from distributed import Client, Scheduler
from prerequisites import require

from conftest import tessera_bin

TOKEN = "cluster-token_0123456789"


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def remote_node():
    """A network namespace joined to this one by a veth pair: (namespace, host-side address,
    namespace-side address). Removed afterwards, with the processes the test ran in it."""
    require(os.geteuid() == 0, "needs root to make a network namespace")
    require(shutil.which("ip") is not None, "needs iproute2's `ip`")
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    ns, here, there = f"tsr{tag}", f"tsrh{tag}", f"tsrn{tag}"
    subnet = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
    host_ip, node_ip = f"{subnet}.1", f"{subnet}.2"
    ip("netns", "add", ns)
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", here)
        ip("link", "set", here, "up")
        ip("-n", ns, "addr", "add", f"{node_ip}/30", "dev", there)
        ip("-n", ns, "link", "set", there, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns, host_ip, node_ip
    finally:
        subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start_workers(ns, node_ip, scheduler, n):
    """`n` dask worker processes inside namespace `ns`, registered with `scheduler`."""
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "distributed.cli.dask_worker",
         scheduler, "--host", node_ip, "--nworkers", str(n), "--nthreads", "1",
         "--no-dashboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def read_on_remote_workers(server_location, remote_node):
    """Plans `planes` at `server_location`, computes it on two workers in the other
    namespace through the advertised address, and returns (advertised, sums, whole)."""
    ns, host_ip, node_ip = remote_node
    client = TensorFlightClient(server_location, token=TOKEN, cache_bytes=0)
    advertised = client.advertised_location
    assert advertised, "the server advertised no address"
    tensor = client.get_tensor("planes", export_location=advertised)
    assert tensor.npartitions > 4

    async def scheduler_then_compute():
        async with Scheduler(host=host_ip, port=0, dashboard_address=None) as scheduler:
            workers = start_workers(ns, node_ip, scheduler.address, 2)
            try:
                async with Client(scheduler.address, asynchronous=True) as dask:
                    await dask.wait_for_workers(2, timeout=120)
                    hosts = {w["host"] for w in dask.scheduler_info()["workers"].values()}
                    assert hosts == {node_ip}, hosts
                    sums = await dask.compute(tensor.astype(np.uint64).sum(axis=(1, 2)))
                    whole = await dask.compute(tensor)
                    return sums, whole
            finally:
                workers.terminate()
                try:
                    workers.wait(30)
                except subprocess.TimeoutExpired:
                    workers.kill()
                    workers.wait()

    sums, whole = asyncio.run(scheduler_then_compute())
    return advertised, sums, whole


@pytest.fixture
def planes_dir(tmp_path):
    rng = np.random.default_rng(32)
    planes = rng.integers(0, 2**16, (10, 48, 64), dtype=np.uint16)
    d = tmp_path / "data"
    d.mkdir()
    np.save(d / "planes.npy", planes)
    return d, planes


SMALL_CHUNKS = ("--chunk-target", "8KiB", "--mapped-chunk-target", "8KiB", "--token", TOKEN)


def check(planes, sums, whole):
    np.testing.assert_array_equal(sums, planes.astype(np.uint64).sum(axis=(1, 2)))
    assert whole.dtype == planes.dtype and whole.tobytes() == planes.tobytes()


def test_workers_on_another_node_read_through_the_listen_address(
    start_server, planes_dir, remote_node
):
    """Bound to one non-loopback address and told nothing, the server advertises it."""
    data, planes = planes_dir
    server = start_server(data, extra=SMALL_CHUNKS, listen=f"{remote_node[1]}:0")
    advertised, sums, whole = read_on_remote_workers(server.location, remote_node)
    assert advertised == server.location
    check(planes, sums, whole)


def test_workers_on_another_node_read_through_the_external_location(
    start_server, planes_dir, remote_node
):
    """Bound to every interface, dialled here on loopback: the graph carries the configured
    `--external-location`, not the loopback address the planning client used."""
    data, planes = planes_dir
    port = free_port("0.0.0.0")
    external = f"grpc://{remote_node[1]}:{port}"
    start_server(
        data,
        extra=(*SMALL_CHUNKS, "--external-location", external),
        listen=f"0.0.0.0:{port}",
    )
    advertised, sums, whole = read_on_remote_workers(f"grpc://127.0.0.1:{port}", remote_node)
    assert advertised == external
    check(planes, sums, whole)


def test_loopback_and_unspecified_binds_advertise_nothing(start_server, planes_dir):
    data, _ = planes_dir
    loopback = start_server(data)
    assert TensorFlightClient(loopback.location, cache_bytes=0).advertised_location is None
    port = free_port("0.0.0.0")
    everywhere = start_server(data, extra=("--token", TOKEN), listen=f"0.0.0.0:{port}")
    client = TensorFlightClient(f"grpc://127.0.0.1:{port}", token=TOKEN, cache_bytes=0)
    assert client.advertised_location is None
    assert any("--external-location" in line for line in everywhere.log), everywhere.log


@pytest.mark.parametrize(
    "url, why",
    [
        ("node7:8815", "scheme 'node7'"),
        ("grpc://node7", "no port"),
        ("grpc://0.0.0.0:8815", "unspecified address"),
        ("grpc://node7:8815/data", "path"),
    ],
)
def test_a_location_no_client_can_dial_is_refused_at_startup(tmp_path, url, why):
    run = subprocess.run(
        [tessera_bin(), "serve", str(tmp_path), "--cache-dir", str(tmp_path / "c"),
         "--state-dir", str(tmp_path / "s"), "--external-location", url],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode != 0
    assert url in run.stderr and why in run.stderr and "external_location" in run.stderr, run.stderr
