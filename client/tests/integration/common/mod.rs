//! Shared by the client's integration tests, on top of `tessera-test-support`: the real
//! `tessera` binary serving fixtures from a temporary cache directory, `.npy` fixtures with
//! known bytes, and the reference crop of a [`Region`].
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::ffi::OsStr;
use std::path::PathBuf;

use tessera_client::{CacheStats, Client, ClientOptions, Region};
pub use tessera_test_support::npy_fixture;
use tessera_test_support::process::ServerProcess;
use tessera_test_support::region_bytes;

/// A `tessera serve` child process with its own cache directory; killed on drop.
pub struct Server {
    process: ServerProcess,
    /// `grpc://127.0.0.1:PORT`.
    pub url: String,
    /// Holds the cache directory (`cache/`) and anything else the test puts there.
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Serves `sources` with `extra` arguments (e.g. `["--cache", "memory"]`).
    pub fn start(sources: &[PathBuf], extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let mut args: Vec<&OsStr> = sources.iter().map(|s| s.as_os_str()).collect();
        args.extend([OsStr::new("--cache-dir"), cache.as_os_str()]);
        args.extend(extra.iter().map(OsStr::new));
        let process = ServerProcess::spawn(&args);
        let url = process.url().replacen("http://", "grpc://", 1);
        Server { process, url, dir }
    }

    /// The server's `cache_stats`.
    pub async fn stats(&self) -> CacheStats {
        let client = Client::connect(&self.url, ClientOptions::default().with_mmap(false))
            .await
            .unwrap();
        client.cache_stats().await.unwrap()
    }

    /// The server process (its log, pid, memory).
    pub fn process(&self) -> &ServerProcess {
        &self.process
    }
}

/// Client options for tests: nothing from the environment.
pub fn options(mmap: bool) -> ClientOptions {
    ClientOptions::default()
        .with_mmap(mmap)
        .with_pin_limit(None)
        .with_concurrency(4)
}

/// The C-order bytes of `region` of a C-order array.
pub fn crop(data: &[u8], shape: &[u64], itemsize: usize, region: &Region) -> Vec<u8> {
    region_bytes(data, shape, itemsize, &region.start, &region.stop)
}
