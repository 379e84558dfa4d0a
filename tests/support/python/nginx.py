"""Debian's nginx in the foreground for the interop tests: its own prefix, temp folders and
logs under the test's tmp dir, listening on a free loopback port. A test gives what goes in
the `http { }` block (its server blocks, logs, upstreams) as a function of the port."""
import os
import shutil
import socket
import subprocess
import time

import pytest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """Started by the constructor (fails the test, with nginx's error log, if it does not
    answer within 20 s); `stop()` ends it."""

    def __init__(self, prefix, http_block, worker_connections=256):
        prefix.mkdir()
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / temp).mkdir()
        self.prefix = prefix
        self.port = free_port()
        self.error_log = prefix / "error.log"
        # As root, workers would switch to `nobody`, who cannot enter pytest's tmp dirs.
        user = "user root;\n" if os.geteuid() == 0 else ""
        conf = prefix / "nginx.conf"
        conf.write_text(
            f"""{user}daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {self.error_log} info;
events {{ worker_connections {worker_connections}; }}
http {{
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{http_block(self.port)}}}
"""
        )
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(prefix), "-c", str(conf), "-e", str(self.error_log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail("nginx did not start:\n" + self.error_log.read_text())
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
