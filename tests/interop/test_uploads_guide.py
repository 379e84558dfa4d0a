"""docs/guides/uploads.md runs as written: its shell block starts the server its Python
connects to (same address, the token it defines), and every Python block runs, in order,
against a real `--writable --token` server, reading back the bytes it uploaded."""
import pathlib
import re
import shlex

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "uploads.md"
TOKEN = "guide-token_0123456789abcdef"


def blocks(kind):
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_shell_block_defines_what_the_python_uses():
    shell = "\n".join(blocks("sh"))
    python = "\n".join(blocks("python"))
    assert re.search(r"^export TOKEN=", shell, re.M), shell
    assert '--token "$TOKEN"' in shell and "--writable" in shell
    serve = next(line for line in shell.splitlines() if line.startswith("tessera serve"))
    assert "--listen" not in shlex.split(serve.split("#")[0]), "the guide's port is the default"
    locations = set(re.findall(r'"(grpcs?://[^"]+)"', python))
    assert locations == {"grpc://127.0.0.1:8815"}, locations
    assert 'os.environ["TOKEN"]' in python


def test_every_python_block_runs_in_order(start_server, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(data, extra=("--writable", "--token", TOKEN))
    monkeypatch.setenv("TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for i, code in enumerate(blocks("python")):
        code = code.replace("grpc://127.0.0.1:8815", server.location)
        exec(compile(code, f"{GUIDE}:python-block-{i}", "exec"), namespace)
    result = namespace["result"]
    np.testing.assert_array_equal(namespace["back"], result)
    np.testing.assert_array_equal(namespace["stored"][...], result)
    copied = tmp_path / "denoised-z.zarr"
    assert copied.is_dir()
    client = namespace["client"]
    status = client.get_upload_status("scratch/@fields/stack")
    assert status["state"] == "DISCARDED" and "bad parameters" in status.get("reason", ""), status
