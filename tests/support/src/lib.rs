//! Shared by the client's integration tests and the end-to-end suite: the real `tessera`
//! binary as a child process ([`process`]), Flight connections ([`connect`]), `.npy` files with
//! known bytes and the reference crop they are checked against ([`data`]), and an HTTP client
//! for the metrics endpoint ([`http`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod connect;
pub mod data;
pub mod http;
pub mod process;

pub use data::{npy_fixture, pattern, region_bytes, write_npy, write_npy_ordered};

/// A scenario that cannot run on this machine: skipped with `reason` on a workstation,
/// a failure under CI (`CI=true`), where every scenario must run.
pub fn skip_unless_ci(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true, so this scenario must run, but: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}
