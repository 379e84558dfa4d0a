"""How the `tessera` commands word what a new user meets (issue 35, first hour): flags and
environment variables rather than Rust calls, one mention of a refused file's path, `-o -`
for standard output, plurals, `warm` refusing an unknown id as `get` does, cache entries
beside a byte budget, and `config check` naming a directory the server could not write."""
import io
import subprocess

import numpy as np

from conftest import tessera_bin

TOKEN = "wording-token_0123456789ab"


def run(*args, env=None):
    return subprocess.run([tessera_bin(), *map(str, args)], capture_output=True, timeout=120, env=env)


def text(done):
    return done.stdout.decode(), done.stderr.decode()


def test_a_missing_token_names_the_flag_and_the_variable(start_server, fixture_dir):
    server = start_server(fixture_dir, extra=("--token", TOKEN))
    _, err = text(run("ls", server.location))
    assert "--token" in err and "TESSERA_TOKEN" in err, err
    assert "ClientOptions" not in err, err


def test_get_dash_o_dash_writes_the_npy_to_stdout(start_server, fixture_dir, arrays, tmp_path):
    server = start_server(fixture_dir)
    done = run("get", server.location, "u16_stack", "-o", "-")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(io.BytesIO(done.stdout)), arrays["u16_stack"])
    assert "wrote" in done.stderr.decode()
    assert not (tmp_path / "-").exists()


def test_counts_are_plural_only_when_plural(start_server, fixture_dir):
    server = start_server(fixture_dir)
    out, err = text(run("warm", server.location, "bool"))
    assert " 1 chunk " in out and "of 1 array " in out, out + err
    assert "1 chunks" not in out and "1 arrays" not in out, out


def test_warm_words_an_unknown_id_as_get_does(start_server, fixture_dir, tmp_path):
    server = start_server(fixture_dir)
    _, get_err = text(run("get", server.location, "nosuch", "-o", tmp_path / "x.npy"))
    warm = run("warm", server.location, "nosuch")
    _, warm_err = text(warm)
    assert warm.returncode == 1
    assert f"no tensor 'nosuch' on {server.location}" in warm_err, warm_err
    assert f"tessera ls {server.location}" in warm_err and f"tessera ls {server.location}" in get_err
    assert "Detail:" not in warm_err and "status:" not in warm_err, warm_err


def test_a_refused_file_is_named_once_in_ls(start_server, fixture_dir):
    (fixture_dir / "broken.npy").write_bytes(b"not an npy file at all")
    server = start_server(fixture_dir)
    out, _ = text(run("ls", server.location))
    [line] = [l for l in out.splitlines() if "broken" in l and "npy" in l]
    assert line.count(str(fixture_dir / "broken.npy")) == 1, line


def test_stats_entries_beside_a_byte_budget_do_not_claim_no_limit(start_server, fixture_dir):
    server = start_server(fixture_dir)
    out, _ = text(run("stats", server.location))
    [entries] = [l for l in out.splitlines() if "entries:" in l]
    assert "no limit" not in entries, out


def test_config_check_names_an_unwritable_state_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = tmp_path / "tessera.toml"
    config.write_text(f'writable = true\nstate_dir = "{blocker}/state"\n[cache]\ndir = "{tmp_path}/cache"\n')
    done = run("config", "check", config)
    _, err = text(done)
    assert done.returncode == 1, err
    assert f"state_dir {blocker}/state is not writable" in err and "would not start" in err, err
    fine = tmp_path / "fine.toml"
    fine.write_text(f'writable = true\nstate_dir = "{tmp_path}/state"\n[cache]\ndir = "{tmp_path}/cache"\n')
    done = run("config", "check", fine)
    assert done.returncode == 0 and "not writable" not in done.stderr.decode(), done.stderr
    assert not (tmp_path / "state").exists(), "config check creates nothing"
