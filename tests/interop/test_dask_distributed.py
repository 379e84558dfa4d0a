"""Scale-out: a dask.distributed cluster of two worker processes reads a tensor
from Tessera through the unmodified biopb client and reduces it, bit-exact
against numpy. The task graph travels to the workers pickled; each worker
process opens its own connection to the server."""
import os

import numpy as np
from biopb.tensor import TensorFlightClient
from distributed import Client, LocalCluster, get_task_stream


def test_two_worker_processes_reduce_bit_exact(start_server, tmp_path):
    rng = np.random.default_rng(11)
    planes = rng.integers(0, 2**16, (12, 64, 80), dtype=np.uint16)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "planes.npy", planes)
    # Small chunks on both grids (socket and mapped plans), so the read is many
    # tasks spread over both workers.
    server = start_server(data, extra=("--chunk-target", "8KiB", "--mapped-chunk-target", "8KiB"))
    tensor = TensorFlightClient(server.location, cache_bytes=0).get_tensor("planes")
    assert tensor.npartitions > 4

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=40,
    ) as cluster, Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        assert len(worker_pids) == 2 and os.getpid() not in worker_pids
        with get_task_stream(client) as stream:
            sums = tensor.astype(np.uint64).sum(axis=(1, 2)).compute()
            whole = tensor.compute()
        ran_on = {task["worker"] for task in stream.data}
        assert ran_on and ran_on <= set(cluster.scheduler_info["workers"]), ran_on

    expected = planes.astype(np.uint64).sum(axis=(1, 2))
    assert sums.dtype == np.uint64
    np.testing.assert_array_equal(sums, expected)
    assert whole.dtype == planes.dtype
    assert whole.tobytes() == planes.tobytes()
