"""docs/operations.md's systemd unit: systemd accepts it (`systemd-analyze verify`, with
its ExecStart pointed at the binary under test), and under its `ProtectSystem=strict`
every directory the configuration example (docs/configuration.md, "A complete file")
writes to is one the unit makes writable: a `--writable` server started by it can keep
its state."""
import configparser
import pathlib
import re
import shutil
import subprocess
import tomllib

from conftest import tessera_bin

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def unit_text():
    [unit] = re.findall(r"```ini\n(.*?)```", OPERATIONS.read_text(), re.S)
    return unit


def service():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(unit_text())
    return parser["Service"]


def writable_dirs(svc):
    dirs = {f"/var/cache/{name}" for name in svc.get("CacheDirectory", "").split()}
    dirs |= {f"/var/lib/{name}" for name in svc.get("StateDirectory", "").split()}
    dirs |= set(svc.get("ReadWritePaths", "").split())
    return dirs


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd"
    text = unit_text().replace("/usr/local/bin/tessera", tessera_bin())
    unit = tmp_path / "tessera.service"
    unit.write_text(text)
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # Nothing it says about this unit (other units on the host are not ours to judge).
    assert "tessera.service" not in out.stderr, out.stderr


def test_the_sandbox_leaves_the_configured_directories_writable():
    svc = service()
    assert svc["ProtectSystem"] == "strict"
    [example] = re.findall(r"## A complete file\n\n```toml\n(.*?)```", CONFIGURATION.read_text(), re.S)
    config = tomllib.loads(example)
    wanted = {config["state_dir"], config["cache"]["dir"]}
    writable = writable_dirs(svc)
    missing = {d for d in wanted if not any(d == w or d.startswith(w.rstrip("/") + "/") for w in writable)}
    assert not missing, f"{missing} would be read-only under ProtectSystem=strict"
    assert svc["ExecStart"].split()[0] == "/usr/local/bin/tessera"
    assert "useradd" in OPERATIONS.read_text() and "install -m 0755" in OPERATIONS.read_text()
