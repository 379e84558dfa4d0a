//! `tessera serve` as a new user meets it: a path that does not exist stops it (exit 1,
//! one line) unless `--watch` asks to wait for it; the startup log says how to read (the
//! `tessera ls` command and the Python line) without colour codes off a terminal; a
//! folder is watched by default, so a file copied in is listed by `tessera ls`, and a
//! file it cannot serve is listed with its reason; an RGB image is labelled `y,x,c`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use tessera_test_support::process::{ServerProcess, run_cli};
use tessera_test_support::{npy_fixture, write_npy};

#[test]
fn missing_source_path_stops_serve_unless_watched_for() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo");
    let cache = dir.path().join("cache");
    let run = run_cli(
        &[
            "serve".as_ref(),
            typo.as_os_str(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{}", run.stderr);
    assert!(
        errors[0].contains(&typo.display().to_string()) && errors[0].contains("--watch"),
        "{}",
        errors[0]
    );

    // Asked for explicitly, the path is awaited and served once it appears.
    let server = ServerProcess::spawn(&[
        typo.as_os_str(),
        "--watch".as_ref(),
        "--watch-interval".as_ref(),
        "100ms".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ]);
    std::fs::create_dir(&typo).unwrap();
    npy_fixture(&typo, "late", "<u2", &[8, 8], 3);
    let location = server.url().replacen("http://", "grpc://", 1);
    let listing = ls_until(&location, |text| text.contains("late"));
    assert!(listing.contains("late"), "{listing}");
}

#[test]
fn folder_is_watched_by_default_and_ls_shows_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rgb: Vec<u8> = (0..20 * 30 * 3).map(|i| i as u8).collect();
    write_npy(&data.join("rgb.npy"), "|u1", &[20, 30, 3], &rgb);
    let cache = dir.path().join("cache");
    // The environment of a user: no TESSERA_WATCH, no NO_COLOR.
    let server = ServerProcess::spawn_env(
        &[
            data.as_os_str(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--watch-interval".as_ref(),
            "100ms".as_ref(),
        ],
        &[("TESSERA_WATCH", ""), ("NO_COLOR", "")],
    );
    let location = server.url().replacen("http://", "grpc://", 1);
    // The hint follows the `listening on` line the spawn waited for.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.log_count("read with:") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log().join("\n");
    assert!(
        log.contains(&format!("read with: tessera ls {location}")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "biopb.tensor.TensorFlightClient(\"{location}\").get_tensor(\"rgb\")"
        )),
        "{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {log}"
    );

    let listing = run_cli(&["ls", &location], &[]);
    assert_eq!(listing.code, Some(0), "{}", listing.stderr);
    let row = listing
        .stdout
        .lines()
        .find(|l| l.starts_with("rgb "))
        .unwrap();
    assert!(row.ends_with("y,x,s"), "{}", listing.stdout);
    assert!(!listing.stdout.contains("refused"), "{}", listing.stdout);

    // Copied in while serving: a good file and one that is not an .npy at all.
    npy_fixture(&data, "new1", "<f4", &[10, 10], 5);
    std::fs::write(data.join("broken.npy"), b"not an npy file").unwrap();
    let text = ls_until(&location, |t| t.contains("new1") && t.contains("broken"));
    assert!(text.lines().any(|l| l.starts_with("new1 ")), "{text}");
    let refused = text
        .split("refused (1 file, not served):")
        .nth(1)
        .unwrap_or_else(|| panic!("no refused section in\n{text}"));
    let line = refused.lines().find(|l| l.contains("broken")).unwrap();
    assert!(
        line.contains(&data.join("broken.npy").display().to_string()) && line.contains(": "),
        "{line}"
    );
}

/// `tessera ls LOCATION` every 100 ms until `done` holds for its output (at most 30 s).
fn ls_until(location: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = run_cli(&["ls", location], &[]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        if done(&run.stdout) || Instant::now() > deadline {
            return run.stdout;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
