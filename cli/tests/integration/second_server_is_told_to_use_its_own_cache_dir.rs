//! A second `tessera serve` on a cache directory another server holds stops with exit code
//! 1 and one line that names the holder (pid and listen address) and the way out
//! (`--cache-dir DIR`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_test_support::npy_fixture;
use tessera_test_support::process::{ServerProcess, run_cli};

#[test]
fn lock_conflict_names_the_holder_and_cache_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (plane, _) = npy_fixture(dir.path(), "plane", "<u2", &[20, 30], 7);
    let cache = dir.path().join("cache");
    let first =
        ServerProcess::spawn(&[plane.as_os_str(), "--cache-dir".as_ref(), cache.as_os_str()]);
    let second = run_cli(
        &[
            "serve".as_ref(),
            plane.as_os_str(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        &[("RUST_BACKTRACE", "1")],
    );
    assert_eq!(second.code, Some(1), "{}", second.stderr);
    let errors: Vec<&str> = second
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{}", second.stderr);
    for needle in [
        format!("pid {}", first.pid()),
        format!("listening on grpc://{}", first.addr),
        "--cache-dir DIR".to_string(),
    ] {
        assert!(
            errors[0].contains(&needle),
            "{needle:?} not in {}",
            errors[0]
        );
    }
    assert!(!second.stderr.contains("backtrace"), "{}", second.stderr);
}
