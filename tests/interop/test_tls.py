"""TLS (`--tls-cert` / `--tls-key`): pyarrow and the unmodified biopb client read
bit-exact over `grpcs://` when they trust the server's self-signed certificate, and
refuse a server they do not trust. The certificate is made per test run with the
`openssl` command-line tool (skipped when it is missing)."""
import shutil
import subprocess

import numpy as np
import pyarrow.flight as flight
import pytest
from biopb.tensor import TensorFlightClient, descriptor_pb2, ticket_pb2

from conftest import tessera_bin

TOKEN = "tls-token_0123456789abcdef"


def make_cert(directory, name):
    """A self-signed P-256 leaf for 127.0.0.1 and localhost; returns (cert, key, pem)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            # A leaf, not a CA: rustls (tessera's client) refuses a CA certificate presented
            # as the server's own ("CaUsedAsEndEntity").
            "-addext", "basicConstraints=critical,CA:FALSE",
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return cert, key, cert.read_bytes()


@pytest.fixture
def tls_files(tmp_path):
    return make_cert(tmp_path, "server")


def tls_port(server):
    assert server.location.startswith("grpcs://"), server.location
    return server.location.rsplit(":", 1)[1]


def test_pyarrow_reads_over_tls(start_server, fixture_dir, arrays, tls_files):
    cert, key, pem = tls_files
    server = start_server(fixture_dir, extra=("--tls-cert", cert, "--tls-key", key))
    client = flight.connect(f"grpc+tls://127.0.0.1:{tls_port(server)}", tls_root_certs=pem)
    health = list(client.do_action(flight.Action("health", b"")))
    assert b'"protocol":3' in health[0].body.to_pybytes().replace(b" ", b"")

    opt = descriptor_pb2.TensorReadOption(array_id="u16_stack")
    opt.fields.paths.append("endpoints")
    request = descriptor_pb2.FlightRequest(tensor_read=opt)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(request.SerializeToString()))
    expected = arrays["u16_stack"]
    got = np.empty_like(expected)
    for endpoint in info.endpoints:
        bounds = ticket_pb2.ChunkBounds.FromString(endpoint.app_metadata)
        table = client.do_get(endpoint.ticket).read_all()
        data = table.column("data")[0].as_py()
        shape = table.column("shape")[0].as_py()
        region = tuple(slice(a, b) for a, b in zip(bounds.start, bounds.stop))
        got[region] = np.frombuffer(data, dtype=expected.dtype).reshape(shape)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["do_get", "mmap"])
def test_biopb_client_reads_over_tls(mode, monkeypatch, start_server, fixture_dir, arrays, tls_files):
    if mode == "do_get":
        monkeypatch.setenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", "1")
    else:
        monkeypatch.delenv("BIOPB_CACHEFILE_TRANSFER_DISABLED", raising=False)
    cert, key, pem = tls_files
    server = start_server(
        fixture_dir, extra=("--tls-cert", cert, "--tls-key", key, "--chunk-target", "6KiB")
    )
    client = TensorFlightClient(server.location, tls_ca_pem=pem, cache_bytes=0)
    assert client.health_check()["protocol"] == 3
    for name in ("u16_stack", "f32_4d", "fortran"):
        np.testing.assert_array_equal(client.get_array(name), arrays[name], err_msg=name)
    stats = client.cache_stats()
    if mode == "mmap":
        # The fast path also applies to a TLS loopback location.
        assert stats["locates"] > 0, stats
    else:
        assert stats["locates"] == 0 and stats["do_gets"] > 0, stats


def test_tls_and_token_together(start_server, fixture_dir, arrays, tls_files):
    cert, key, pem = tls_files
    server = start_server(
        fixture_dir, extra=("--tls-cert", cert, "--tls-key", key, "--token", TOKEN)
    )
    client = TensorFlightClient(server.location, tls_ca_pem=pem, token=TOKEN, cache_bytes=0)
    np.testing.assert_array_equal(client.get_array("u8_rgb"), arrays["u8_rgb"])
    anonymous = flight.connect(f"grpc+tls://127.0.0.1:{tls_port(server)}", tls_root_certs=pem)
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(anonymous.do_action(flight.Action("chunk_locate", b"")))


def test_untrusted_and_plaintext_clients_are_refused(start_server, fixture_dir, tls_files, tmp_path):
    cert, key, _ = tls_files
    server = start_server(fixture_dir, extra=("--tls-cert", cert, "--tls-key", key))
    port = tls_port(server)
    _, _, other_pem = make_cert(tmp_path, "other")
    stranger = flight.connect(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=other_pem)
    with pytest.raises(flight.FlightUnavailableError):
        list(stranger.do_action(flight.Action("health", b""), flight.FlightCallOptions(timeout=10)))
    plaintext = flight.connect(f"grpc://127.0.0.1:{port}")
    with pytest.raises(flight.FlightError):
        list(plaintext.do_action(flight.Action("health", b""), flight.FlightCallOptions(timeout=10)))


def test_bad_certificate_pair_stops_the_server_with_a_named_file(tmp_path, fixture_dir, tls_files):
    cert, _, _ = tls_files
    _, other_key, _ = make_cert(tmp_path, "other")
    for args, needle in [
        (("--tls-cert", cert, "--tls-key", other_key), "not usable together"),
        (("--tls-cert", cert, "--tls-key", tmp_path / "missing.key"), "missing.key"),
        (("--tls-cert", cert), "--tls-key"),
    ]:
        proc = subprocess.run(
            [tessera_bin(), "serve", fixture_dir, "--listen", "127.0.0.1:0",
             "--cache-dir", tmp_path / "cache", *map(str, args)],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode != 0, proc.stderr
        assert needle in proc.stderr, proc.stderr


def test_tessera_cli_reads_over_tls_with_the_ca_and_refuses_without(start_server, fixture_dir, arrays, tls_files, tmp_path):
    cert, key, _ = tls_files
    server = start_server(fixture_dir, extra=("--tls-cert", cert, "--tls-key", key))
    location = f"grpcs://127.0.0.1:{tls_port(server)}"
    out = tmp_path / "out.npy"
    done = subprocess.run(
        [tessera_bin(), "get", location, "u16_stack", "--tls-ca", str(cert), "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert np.load(out).tobytes() == arrays["u16_stack"].tobytes()
    listing = subprocess.run(
        [tessera_bin(), "ls", location.replace("grpcs", "grpc+tls"), "--tls-ca", str(cert)],
        capture_output=True, text=True, timeout=120,
    )
    assert listing.returncode == 0 and "u16_stack" in listing.stdout, listing.stderr
    no_ca = subprocess.run([tessera_bin(), "ls", location], capture_output=True, text=True, timeout=120)
    assert no_ca.returncode != 0 and "CA certificate" in no_ca.stderr, no_ca.stderr
    other, _, _ = make_cert(tmp_path, "stranger")
    untrusted = subprocess.run(
        [tessera_bin(), "ls", location, "--tls-ca", str(other)], capture_output=True, text=True, timeout=120
    )
    assert untrusted.returncode != 0, untrusted.stdout
