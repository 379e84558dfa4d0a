//! A child process appends in a loop and is SIGKILLed mid-append. On reopen, every entry the
//! child reported complete is readable with the right bytes and a valid checksum, and no
//! segment file was truncated or rewritten.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::{meta, pattern, segment_files};
use tessera_segments::{Store, StoreOptions};

const CHILD_ENV: &str = "TESSERA_SIGKILL_TEST_CHILD_DIR";

fn len_of(i: u64) -> usize {
    20_000 + (i as usize * 104_729) % 700_000
}

fn opts(dir: &std::ffi::OsStr) -> StoreOptions {
    StoreOptions::new(dir)
        .with_segment_bytes(2 << 20)
        .with_open_segments(2)
        .with_verify_on_read(true)
}

/// Entry point of the child process: appends forever, printing each completed key (does
/// nothing when run as a normal test).
#[test]
fn child_appends_forever() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = Store::open(opts(&dir)).unwrap();
    let mut out = std::io::stdout().lock();
    for i in 0u64.. {
        let data = pattern(i, len_of(i));
        let (a, b) = data.split_at(data.len() / 3);
        store
            .append(
                format!("k{i}").as_bytes(),
                &meta(&[data.len() as i64], "|u1"),
                &[a, b],
            )
            .unwrap();
        writeln!(out, "done {i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn sigkill_mid_append_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_appends_forever",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut done = Vec::new();
    while done.len() < 40 {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(i) = line.strip_prefix("done ") {
            done.push(i.parse::<u64>().unwrap());
        }
    }
    child.kill().unwrap(); // SIGKILL
    for line in lines {
        if let Some(i) = line.unwrap().strip_prefix("done ") {
            done.push(i.parse::<u64>().unwrap());
        }
    }
    child.wait().unwrap();

    let before: Vec<(std::path::PathBuf, Vec<u8>)> = segment_files(&dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    assert!(before.len() >= 2, "the child rotated segments");

    let store = Store::open(opts(dir.as_os_str())).unwrap();
    for i in &done {
        let e = store
            .read(format!("k{i}").as_bytes())
            .unwrap()
            .unwrap_or_else(|| panic!("completed entry k{i} lost"));
        let n = len_of(*i);
        assert_eq!(&e.body[8..8 + n], &pattern(*i, n)[..], "k{i}");
    }
    // Nothing truncated or rewritten: each file still starts with exactly its old bytes.
    for (path, old) in &before {
        let now = std::fs::read(path).unwrap();
        assert!(now.len() >= old.len(), "{} shrank", path.display());
        assert_eq!(
            &now[..old.len()],
            &old[..],
            "{} was rewritten",
            path.display()
        );
    }
    // New appends work and go to new segments.
    let data = pattern(1_000_000, 100);
    let loc = store
        .append(b"after", &meta(&[100], "|u1"), &[&data])
        .unwrap();
    assert!(before.iter().all(|(p, _)| *p != loc.segment_path));
}
