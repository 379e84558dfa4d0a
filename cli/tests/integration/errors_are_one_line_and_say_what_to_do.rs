//! A failing command prints one `error:` line on stderr and exits 1: an unknown id points
//! at `tessera ls`, a port nobody listens on asks whether the server runs there, a missing
//! output folder is named once; no gRPC detail suffix and no backtrace (even with
//! `RUST_BACKTRACE=1`) unless `-v` asks for the causes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_test_support::npy_fixture;
use tessera_test_support::process::{CliRun, ServerProcess, run_cli};

fn one_error_line(run: &CliRun) -> &str {
    assert_eq!(run.code, Some(1), "stderr: {}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line:\n{}", run.stderr);
    assert!(lines[0].starts_with("error: "), "{}", run.stderr);
    for noise in [
        "Detail:",
        "Caused by",
        "backtrace",
        "transport error",
        "Unknown:",
    ] {
        assert!(!run.stderr.contains(noise), "{noise:?} in {}", run.stderr);
    }
    lines[0]
}

#[test]
fn failures_print_one_line_with_the_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let (plane, _) = npy_fixture(dir.path(), "plane", "<u2", &[20, 30], 7);
    let cache = dir.path().join("cache");
    let server =
        ServerProcess::spawn(&[plane.as_os_str(), "--cache-dir".as_ref(), cache.as_os_str()]);
    let location = server.url().replacen("http://", "grpc://", 1);
    let backtrace = [("RUST_BACKTRACE", "1")];

    let out = dir.path().join("out.npy");
    let run = run_cli(
        &["get", &location, "nosuch", "-o", out.to_str().unwrap()],
        &backtrace,
    );
    assert_eq!(
        one_error_line(&run),
        format!("error: no tensor 'nosuch' on {location}; `tessera ls {location}` lists them")
    );
    assert!(!out.exists());

    let missing = dir.path().join("no").join("such");
    let target = missing.join("out.npy");
    let run = run_cli(
        &["get", &location, "plane", "-o", target.to_str().unwrap()],
        &backtrace,
    );
    let line = one_error_line(&run);
    assert_eq!(line.matches(missing.to_str().unwrap()).count(), 1, "{line}");
    assert!(line.contains("No such file or directory"), "{line}");

    // A port nobody listens on: bound once, then released.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("grpc://{}", free.local_addr().unwrap());
    drop(free);
    for command in ["ls", "stats"] {
        let run = run_cli(&[command, &nobody], &backtrace);
        let line = one_error_line(&run);
        assert!(
            line.contains(&format!("cannot connect to '{nobody}'"))
                && line.contains("is a Tessera server running there?"),
            "{line}"
        );
        assert_eq!(line.matches("refused").count(), 1, "{line}");
    }

    // -v: the causes, one per line.
    let run = run_cli(&["-v", "ls", &nobody], &[]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("Caused by"), "{}", run.stderr);
}
