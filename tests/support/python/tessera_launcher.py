"""The one way Python code here starts `tessera serve`: the interop tests
(tests/interop/conftest.py) and the benchmarks (benches/run.py) both use it.

The server listens on 127.0.0.1:0 unless told another address; its address is
read from the "listening on grpc://ADDR" log line, and every stderr line is kept
in `log`.
"""
import os
import re
import subprocess
import threading

# The server's own line, not a refusal quoting another holder's "(pid N, listening on …)".
LISTENING = re.compile(r"(?<!, )listening on (grpcs?://[0-9.:]+)")


class TesseraProcess:
    """A running `tessera serve ARGS --listen LISTEN` (`127.0.0.1:0` by default)."""

    def __init__(self, binary, args, env=None, start_timeout=60, listen="127.0.0.1:0"):
        self.proc = subprocess.Popen(
            [str(binary), "serve", *map(str, args), "--listen", listen],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # Scenarios change sources only under servers that ask for `--watch`.
            env={**os.environ, "RUST_LOG": "info", "TESSERA_WATCH": "false", **(env or {})},
        )
        self.log = []
        self.location = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = LISTENING.search(line)
                if m and not ready.is_set():
                    self.location = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(start_timeout) or self.location is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.log[-30:]))

    @property
    def pid(self):
        return self.proc.pid

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
