//! `tessera config check FILE`: validates, applies `TESSERA_*` over the file,
//! prints the effective configuration with the token redacted, and names
//! unknown keys.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

fn check(file: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command.env_clear().arg("config").arg("check").arg(file);
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command.envs(env.iter().copied());
    command.output().unwrap()
}

#[test]
fn prints_the_effective_configuration_with_env_over_file() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "Secret_Token_0123456789\n").unwrap();
    let file = dir.path().join("tessera.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"0.0.0.0:9000\"\nchunk_target = \"4MiB\"\ntoken_file = \"{}\"\n\
             watch = true\n\n[cache]\nkind = \"memory\"\n\n\
             [[source]]\npath = \"{}\"\nid = \"alpha\"\ndim_labels = [\"y\", \"x\"]\n",
            token_file.display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let out = check(
        &file,
        &[
            ("TESSERA_CHUNK_TARGET", "2MiB"),
            ("TESSERA_METRICS_LISTEN", "127.0.0.1:9815"),
        ],
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    assert!(!stdout.contains("Secret_Token"), "{stdout}");
    for expected in [
        "listen = \"0.0.0.0:9000\"",
        "token = \"<redacted>\"",
        "chunk_target = \"2MiB\"",
        "metrics_listen = \"127.0.0.1:9815\"",
        "watch = true",
        "watch_interval = \"2s\"",
        "log_format = \"text\"",
        "kind = \"memory\"",
        "max_bytes = \"10GiB\"",
        "[[source]]",
        "id = \"alpha\"",
        "dim_labels = [\"y\", \"x\"]",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected} in:\n{stdout}"
        );
    }
}

#[test]
fn unknown_keys_and_bad_values_fail_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:1\"\n[cache]\nsize = \"1GiB\"\n",
    )
    .unwrap();
    let out = check(&file, &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("size") && stderr.contains("bad.toml"),
        "{stderr}"
    );

    std::fs::write(&file, "chunk_target = \"lots\"\n").unwrap();
    let out = check(&file, &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("'lots'"), "{stderr}");
}
