//! Shared by the integration tests: the real `tessera` binary on
//! `127.0.0.1:0` with a temporary cache directory, `.npy` fixtures with known
//! bytes, and a slow reference crop.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tessera_client::{CacheStats, Client, ClientOptions, Region};

/// The `tessera` binary: `$TESSERA_BIN`, else `<workspace>/target/debug/tessera`.
pub fn server_bin() -> PathBuf {
    let path = match std::env::var_os("TESSERA_BIN") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/tessera"),
    };
    assert!(
        path.is_file(),
        "the tessera server binary is missing at {}: build it with \
         `cargo build -p tessera-cli --bin tessera` or point TESSERA_BIN at it",
        path.display()
    );
    path
}

/// A `tessera serve` child process; killed on drop.
pub struct Server {
    child: Child,
    /// `grpc://127.0.0.1:PORT`.
    pub url: String,
    /// Holds the cache directory (and anything else the test puts there).
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Serves `sources` with `extra` arguments (e.g. `["--cache", "memory"]`).
    pub fn start(sources: &[PathBuf], extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(server_bin());
        command
            .arg("serve")
            .args(sources)
            .args(["--listen", "127.0.0.1:0", "--cache-dir"])
            .arg(dir.path().join("cache"))
            .args(extra)
            .env_remove("TESSERA_TOKEN")
            .env_remove("TESSERA_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn tessera serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(at) = line.find("listening on grpc://") {
                    let addr = line[at + "listening on ".len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_string();
                    sent = tx.send(addr).is_ok();
                }
                eprintln!("[tessera] {line}");
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("tessera serve did not print 'listening on grpc://ADDR' in time");
            }
        };
        Server { child, url, dir }
    }

    /// The server's `cache_stats`.
    pub async fn stats(&self) -> CacheStats {
        let client = Client::connect(&self.url, ClientOptions::default().with_mmap(false))
            .await
            .unwrap();
        client.cache_stats().await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Client options for tests: nothing from the environment.
pub fn options(mmap: bool) -> ClientOptions {
    ClientOptions::default()
        .with_mmap(mmap)
        .with_pin_limit(None)
        .with_concurrency(4)
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a C-order version 1.0 `.npy` of `descr` and `shape` holding
/// pseudo-random bytes; returns its path and payload.
pub fn npy_fixture(
    dir: &Path,
    name: &str,
    descr: &str,
    shape: &[u64],
    seed: u64,
) -> (PathBuf, Vec<u8>) {
    let itemsize = tessera_client::itemsize(descr).unwrap();
    let len = shape.iter().product::<u64>() as usize * itemsize;
    let data = pattern(len, seed);
    let path = dir.join(format!("{name}.npy"));
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(header.len() as u16).to_le_bytes());
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(&path, file).unwrap();
    (path, data)
}

/// The C-order bytes of `region` of a C-order array, element by element.
pub fn crop(data: &[u8], shape: &[u64], itemsize: usize, region: &Region) -> Vec<u8> {
    let rank = shape.len();
    let extent = region.shape();
    let count: u64 = extent.iter().product();
    let mut out = Vec::with_capacity(count as usize * itemsize);
    for linear in 0..count {
        let mut rest = linear;
        let mut coords = vec![0u64; rank];
        for axis in (0..rank).rev() {
            coords[axis] = rest % extent[axis] + region.start[axis];
            rest /= extent[axis];
        }
        let offset = coords
            .iter()
            .zip(shape)
            .fold(0u64, |acc, (c, d)| acc * d + c) as usize
            * itemsize;
        out.extend_from_slice(&data[offset..offset + itemsize]);
    }
    out
}
