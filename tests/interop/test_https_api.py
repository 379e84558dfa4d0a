"""The HTTP API beside `--tls-cert`: HTTPS on the Flight endpoint's certificate, so the
token never crosses the network in the clear and an exposed address may be served. A
client that trusts the certificate reads tiles exactly; one that does not, or that speaks
plain HTTP, is refused; a client that opens a connection and never handshakes does not
hold up the others."""
import socket
import ssl
import urllib.error
import urllib.request

import numpy as np
import pytest

from test_http_api import TOKEN, as_array, http_base, pattern
from test_tls import make_cert


@pytest.fixture
def https_server(start_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "pat.npy", pattern().astype("<u2"))
    cert, key, _ = make_cert(tmp_path, "server")
    server = start_server(
        data,
        extra=["--tls-cert", cert, "--tls-key", key, "--token", TOKEN,
               "--http-listen", "0.0.0.0:0"],
    )
    base = http_base(server)
    assert base.startswith("https://0.0.0.0:"), base
    port = int(base.rsplit(":", 1)[1])
    return port, cert


def get(url, context, token=TOKEN):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30, context=context) as r:
        return r.status, r.headers, r.read()


def test_a_trusting_client_reads_tiles_exactly_over_https(https_server):
    port, cert = https_server
    trusting = ssl.create_default_context(cafile=str(cert))
    for host in ("127.0.0.1", "localhost"):
        status, headers, body = get(
            f"https://{host}:{port}/api/tile/pat?level=0&col=1&row=2&c=1&z=2", trusting)
        assert status == 200
        want = pattern()[1:2, 2:3, 1024:1100, 512:1024].astype(np.uint16)
        np.testing.assert_array_equal(as_array(headers, body), want)
    # The token is still required over HTTPS.
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(f"https://127.0.0.1:{port}/api/tile_info/pat", trusting, token="wrong")
    assert refused.value.code == 401


def test_an_untrusting_or_plain_http_client_is_refused(https_server):
    port, _ = https_server
    with pytest.raises(urllib.error.URLError) as untrusted:
        get(f"https://127.0.0.1:{port}/livez", ssl.create_default_context())
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := plain.recv(4096):
            answer += chunk
    # A TLS alert (or nothing), never an HTTP answer in the clear.
    assert not answer.startswith(b"HTTP/"), answer[:80]


def test_a_silent_connection_does_not_hold_up_the_others(https_server):
    port, cert = https_server
    trusting = ssl.create_default_context(cafile=str(cert))
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    try:
        status, _, body = get(f"https://127.0.0.1:{port}/livez", trusting)
        assert status == 200 and b"ok" in body
    finally:
        for s in silent:
            s.close()
