//! Shared helpers of the `npy_*` tests: numpy fixtures, hand-made files, a seeded RNG.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

/// A fixture numpy wrote, with its C-order bytes in a `.raw` sidecar.
#[derive(Debug, Deserialize)]
pub struct Good {
    pub file: String,
    pub raw: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub fortran: bool,
    pub version: Vec<u8>,
}

/// A malformed file and the error kind it must get.
#[derive(Debug, Deserialize)]
pub struct Malformed {
    pub file: String,
    pub expect: String,
}

/// `manifest.json` as the fixture script writes it.
#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub good: Vec<Good>,
    pub malformed: Vec<Malformed>,
}

/// Generated fixtures in a temporary directory (removed on drop).
pub struct Fixtures {
    pub dir: tempfile::TempDir,
    pub manifest: Manifest,
}

impl Fixtures {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs `tests/fixtures/make_npy_fixtures.py` with the venv python (or `$TESSERA_PYTHON`).
pub fn generate() -> Fixtures {
    let python = std::env::var_os("TESSERA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "no python at {}: create the venv (python3 -m venv .venv && .venv/bin/pip install numpy) \
         or set TESSERA_PYTHON to a python with numpy",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let script = workspace().join("tests/fixtures/make_npy_fixtures.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{} {} failed: {}",
        python.display(),
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("manifest.json")).unwrap();
    let manifest = serde_json::from_str(&text).unwrap();
    Fixtures { dir, manifest }
}

/// A `.npy` file with a hand-written header dict, padded to 64 bytes like numpy.
pub fn npy_bytes(dict: &str, payload: &[u8]) -> Vec<u8> {
    let mut text = dict.as_bytes().to_vec();
    while !(10 + text.len() + 1).is_multiple_of(64) {
        text.push(b' ');
    }
    text.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
    out.extend(text);
    out.extend_from_slice(payload);
    out
}

/// xorshift64*: a tiny seeded generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..=max`.
    pub fn upto(&mut self, max: u64) -> u64 {
        self.next_u64() % (max + 1)
    }

    /// A random region of `shape`: often whole axes, sometimes empty, otherwise any span.
    pub fn region(&mut self, shape: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let mut start = Vec::new();
        let mut stop = Vec::new();
        for &dim in shape {
            let (a, b) = match self.upto(5) {
                0 | 1 => (0, dim),
                2 => {
                    let a = self.upto(dim);
                    (a, a)
                }
                _ => {
                    let a = self.upto(dim);
                    (a, a + self.upto(dim - a))
                }
            };
            start.push(a);
            stop.push(b);
        }
        (start, stop)
    }
}

/// The C-order bytes of region `start..stop` of a C-order array, one element at a time.
pub fn naive_region(
    raw: &[u8],
    shape: &[u64],
    itemsize: usize,
    start: &[u64],
    stop: &[u64],
) -> Vec<u8> {
    let rank = shape.len();
    let mut strides = vec![itemsize as u64; rank];
    for axis in (0..rank.saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    let mut out = Vec::new();
    if start.iter().zip(stop).any(|(a, b)| a == b) {
        return out;
    }
    let mut index = start.to_vec();
    loop {
        let offset: u64 = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        let offset = offset as usize;
        out.extend_from_slice(&raw[offset..offset + itemsize]);
        let mut axis = rank;
        loop {
            if axis == 0 {
                return out;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < stop[axis] {
                break;
            }
            index[axis] = start[axis];
        }
    }
}
