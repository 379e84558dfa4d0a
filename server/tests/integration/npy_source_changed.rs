//! A file changed under an open `NpyFile` is reported, never read stale, never a SIGBUS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{File, FileTimes, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::npy_support::npy_bytes;
use tessera_server::npy::{Limits, NpyError, NpyFile};

const SHAPE: [u64; 2] = [64, 128];

fn payload(fill: u8) -> Vec<u8> {
    (0..64 * 128 * 4)
        .map(|i| fill.wrapping_add((i % 251) as u8))
        .collect()
}

fn write_npy(path: &Path, fill: u8) -> Vec<u8> {
    let data = payload(fill);
    std::fs::write(
        path,
        npy_bytes(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 128), }",
            &data,
        ),
    )
    .unwrap();
    data
}

/// Opens a fresh file and checks a read works before anything changes.
fn opened(dir: &Path) -> (NpyFile, Vec<u8>) {
    let path = dir.join("a.npy");
    let data = write_npy(&path, 0);
    let file = NpyFile::open(&path, &Limits::default()).unwrap();
    let mut out = vec![0u8; data.len()];
    file.read_region(&[0, 0], &SHAPE, &mut out).unwrap();
    assert_eq!(out, data);
    file.check_unchanged().unwrap();
    (file, data)
}

fn read_whole(file: &NpyFile) -> Result<Vec<u8>, NpyError> {
    let mut out = vec![0u8; 64 * 128 * 4];
    file.read_region(&[0, 0], &SHAPE, &mut out).map(|()| out)
}

fn assert_changed(err: NpyError, says: &str) {
    match &err {
        NpyError::SourceChanged { file, what } => {
            assert!(file.ends_with("a.npy"));
            assert!(what.contains(says), "{err}");
            assert!(
                err.to_string()
                    .contains("source changed since it was opened"),
                "{err}"
            );
        }
        other => panic!("expected SourceChanged, got {other}"),
    }
}

#[test]
fn identity_is_recorded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = opened(dir.path());
    let meta = std::fs::metadata(file.path()).unwrap();
    let id = file.identity();
    let header_len = file.header().data_offset;
    assert_eq!(
        (id.dev, id.ino, id.size),
        (meta.dev(), meta.ino(), header_len + data.len() as u64)
    );
    assert_eq!(
        id.mtime_ns,
        meta.mtime() * 1_000_000_000 + meta.mtime_nsec()
    );
}

#[test]
fn truncation_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = opened(dir.path());
    let size = file.identity().size;
    OpenOptions::new()
        .write(true)
        .open(file.path())
        .unwrap()
        .set_len(1000)
        .unwrap();
    assert_changed(
        read_whole(&file).unwrap_err(),
        &format!("size went from {size} to 1000 bytes"),
    );
    // A region that lies entirely inside what is left is refused too.
    let mut out = vec![0u8; 4];
    assert_changed(
        file.read_region(&[0, 0], &[1, 1], &mut out).unwrap_err(),
        "size went",
    );
    assert_changed(file.check_unchanged().unwrap_err(), "size went");
}

#[test]
fn growth_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = opened(dir.path());
    let size = file.identity().size;
    let handle = OpenOptions::new().append(true).open(file.path()).unwrap();
    std::io::Write::write_all(&mut &handle, b"more").unwrap();
    assert_changed(
        read_whole(&file).unwrap_err(),
        &format!("size went from {size} to {} bytes", size + 4),
    );
}

#[test]
fn in_place_rewrite_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = opened(dir.path());
    let before = file.identity().mtime_ns;
    let new = npy_bytes(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 128), }",
        &payload(7),
    );
    let handle = OpenOptions::new().write(true).open(file.path()).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&handle, &new, 0).unwrap();
    // Timestamps are coarse: make the write's mtime differ as any later write's would.
    let later =
        SystemTime::UNIX_EPOCH + Duration::from_nanos(before as u64) + Duration::from_secs(1);
    handle
        .set_times(FileTimes::new().set_modified(later))
        .unwrap();
    assert_changed(read_whole(&file).unwrap_err(), "modified");
    assert_changed(file.check_unchanged().unwrap_err(), "modified");
}

#[test]
fn replacement_is_reported_and_old_bytes_are_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = opened(dir.path());
    let other = dir.path().join("b.npy");
    write_npy(&other, 9);
    std::fs::rename(&other, file.path()).unwrap();
    // The open descriptor still reaches the old inode; serving it would be stale.
    assert_changed(read_whole(&file).unwrap_err(), "different file (replaced)");
    assert_changed(file.check_unchanged().unwrap_err(), "replaced");
}

#[test]
fn deletion_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = opened(dir.path());
    std::fs::remove_file(file.path()).unwrap();
    assert_changed(read_whole(&file).unwrap_err(), "no longer exists");
    assert_changed(file.check_unchanged().unwrap_err(), "no longer exists");
}

#[test]
fn a_file_truncated_before_open_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.npy");
    let data = write_npy(&path, 0);
    let header_len = std::fs::metadata(&path).unwrap().len() - data.len() as u64;
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(header_len + 100)
        .unwrap();
    match NpyFile::open(&path, &Limits::default()).unwrap_err() {
        NpyError::TruncatedPayload {
            present, declared, ..
        } => assert_eq!((present, declared), (100, 32768)),
        other => panic!("expected TruncatedPayload, got {other}"),
    }
}
