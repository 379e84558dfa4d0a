//! The directory lock: a second open (in this process, or in another process) is refused with
//! an error naming the directory and the holder's pid; once the holder closes (or dies) the
//! directory opens again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use tessera_segments::{Store, StoreError, StoreOptions};

const CHILD_ENV: &str = "TESSERA_LOCK_TEST_CHILD_DIR";

/// Entry point of the child process: tries to open the directory and reports the outcome
/// through its exit code (does nothing when run as a normal test).
#[test]
fn child_tries_to_open() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    match Store::open(StoreOptions::new(dir)) {
        Err(StoreError::Locked { holder_pid, .. }) => {
            println!("locked by {holder_pid:?}");
            std::process::exit(3);
        }
        Err(e) => {
            println!("other error: {e}");
            std::process::exit(4);
        }
        Ok(_) => std::process::exit(0),
    }
}

#[test]
fn second_process_refused_by_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let store = Store::open(StoreOptions::new(&dir)).unwrap();

    let err = Store::open(StoreOptions::new(&dir)).unwrap_err();
    match &err {
        StoreError::Locked {
            dir: d,
            holder_pid,
            holder_note,
        } => {
            assert_eq!(d, &dir);
            assert_eq!(*holder_pid, Some(std::process::id()));
            assert_eq!(*holder_note, None);
        }
        other => panic!("expected Locked, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&dir.display().to_string()), "{msg}");
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");

    // The holder's note (where the server listens) rides beside its pid.
    store
        .note_holder("listening on grpc://127.0.0.1:1")
        .unwrap();
    let msg = Store::open(StoreOptions::new(&dir))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!(
            "(pid {}, listening on grpc://127.0.0.1:1)",
            std::process::id()
        )),
        "{msg}"
    );

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_tries_to_open", "--nocapture"])
        .env(CHILD_ENV, &dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "child should be refused by the lock: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("Some({})", std::process::id())),
        "child names the holder pid"
    );

    drop(store);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_tries_to_open", "--nocapture"])
        .env(CHILD_ENV, &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "lock released after close");
    Store::open(StoreOptions::new(&dir)).unwrap();
}
