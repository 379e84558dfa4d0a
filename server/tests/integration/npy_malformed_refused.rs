//! Every file of the malformed corpus is refused with its own error, naming file and fault.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use crate::npy_support::{generate, npy_bytes};
use tessera_server::npy::{Limits, NpyError, NpyFile, NpyView, read_stream};

/// The variant's name; exhaustive, so a new variant must be placed here.
fn kind(err: &NpyError) -> &'static str {
    match err {
        NpyError::Io { .. } => "Io",
        NpyError::NotAFile { .. } => "NotAFile",
        NpyError::EmptyFile { .. } => "EmptyFile",
        NpyError::BadMagic { .. } => "BadMagic",
        NpyError::UnsupportedVersion { .. } => "UnsupportedVersion",
        NpyError::HeaderTooLong { .. } => "HeaderTooLong",
        NpyError::TruncatedHeader { .. } => "TruncatedHeader",
        NpyError::MisalignedHeader { .. } => "MisalignedHeader",
        NpyError::HeaderEncoding { .. } => "HeaderEncoding",
        NpyError::ObjectDtype { .. } => "ObjectDtype",
        NpyError::StructuredDtype { .. } => "StructuredDtype",
        NpyError::UnsupportedDtype { .. } => "UnsupportedDtype",
        NpyError::HeaderSyntax { .. } => "HeaderSyntax",
        NpyError::UnknownKey { .. } => "UnknownKey",
        NpyError::DuplicateKey { .. } => "DuplicateKey",
        NpyError::MissingKey { .. } => "MissingKey",
        NpyError::NegativeDimension { .. } => "NegativeDimension",
        NpyError::SizeOverflow { .. } => "SizeOverflow",
        NpyError::ScalarShape { .. } => "ScalarShape",
        NpyError::LimitExceeded { .. } => "LimitExceeded",
        NpyError::TruncatedPayload { .. } => "TruncatedPayload",
        NpyError::OutOfMemory { .. } => "OutOfMemory",
        NpyError::InvalidRegion { .. } => "InvalidRegion",
        NpyError::OutputSize { .. } => "OutputSize",
        NpyError::SourceChanged { .. } => "SourceChanged",
        NpyError::SourceBusy { .. } => "SourceBusy",
        NpyError::Outside { .. } => "Outside",
    }
}

/// What each refusal must say about the file, besides naming it.
const SAYS: &[(&str, &str)] = &[
    (
        "object_pickle.npy",
        "object dtype ('|O') is refused: its payload is a pickle",
    ),
    ("object_lt.npy", "object dtype ('<O') is refused"),
    ("object_first.npy", "object dtype ('|O') is refused"),
    (
        "truncated_payload.npy",
        "payload truncated: 156 bytes present, 256 declared",
    ),
    (
        "truncated_header.npy",
        "header truncated: 40 bytes present, 128 needed",
    ),
    (
        "bad_magic.npy",
        r#"not a .npy file: it begins with "\u{89}PNG\r\n\u{1a}\n""#,
    ),
    ("empty.npy", "the file is empty"),
    (
        "structured.npy",
        "structured dtype `[('a', '<i4'), ('b', '<f8')]` is refused",
    ),
    (
        "python_expression.npy",
        "the value of 'descr' must be a quoted dtype string, found `__import__('os').system('true')",
    ),
    ("extra_key.npy", "header key 'foo' is not allowed"),
    (
        "duplicate_key.npy",
        "header key 'shape' appears more than once",
    ),
    ("missing_key.npy", "header key 'fortran_order' is missing"),
    ("negative_dim.npy", "shape dimension -1 is negative"),
    (
        "overflow_shape.npy",
        "byte size of shape (1099511627776, 1099511627776, 8) overflows u64",
    ),
    (
        "overflow_dim.npy",
        "byte size of shape (1180591620717411303424,) overflows u64",
    ),
    ("version_9.npy", "unknown .npy version 9.0"),
    (
        "header_len_2_31.npy",
        "header length 2147483648 exceeds the limit of 65536 bytes",
    ),
    ("unicode_u7.npy", "dtype '<U7' is not supported"),
    ("longdouble_f16.npy", "dtype '<f16' is not supported"),
    ("datetime.npy", "dtype '<M8[ns]' is not supported"),
    ("scalar.npy", "scalar shape () is not served"),
    (
        "fortran_not_bool.npy",
        "the value of 'fortran_order' must be True or False, found `1",
    ),
    (
        "shape_not_tuple.npy",
        "shape (3) is a parenthesised integer, not a tuple",
    ),
    ("misaligned.npy", "which is not a multiple of 16"),
    ("no_newline.npy", "the header must end with a newline"),
    ("non_utf8_v3.npy", "a version 3.0 header must be UTF-8"),
];

fn check(err: &NpyError, expect: &str, says: &str, origin: &str, how: &str) {
    assert_eq!(kind(err), expect, "{how}: {err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{origin}: ")),
        "{how}: does not name {origin}: {text}"
    );
    assert!(text.contains(says), "{how}: {text:?} does not say {says:?}");
}

#[test]
fn every_malformed_file_gets_its_own_error() {
    let fixtures = generate();
    let limits = Limits::default();
    let listed: BTreeSet<&str> = fixtures
        .manifest
        .malformed
        .iter()
        .map(|m| m.file.as_str())
        .collect();
    let known: BTreeSet<&str> = SAYS.iter().map(|(file, _)| *file).collect();
    assert_eq!(
        listed, known,
        "the corpus and this test list different files"
    );
    let kinds: BTreeSet<&str> = fixtures
        .manifest
        .malformed
        .iter()
        .map(|m| m.expect.as_str())
        .collect();
    assert!(kinds.len() >= 18, "only {} distinct kinds", kinds.len());

    for bad in &fixtures.manifest.malformed {
        let says = SAYS.iter().find(|(file, _)| *file == bad.file).unwrap().1;
        let path = fixtures.path(&bad.file);
        let shown = path.display().to_string();
        let what = |how: &str| format!("{} via {how}", bad.file);

        let err = NpyFile::open(&path, &limits).unwrap_err();
        check(&err, &bad.expect, says, &shown, &what("NpyFile::open"));
        assert_eq!(err.file(), Some(path.as_path()));
        let err = NpyFile::read_all(&path, &limits).unwrap_err();
        let stream_says = if bad.file == "truncated_payload.npy" {
            "payload truncated"
        } else {
            says
        };
        check(
            &err,
            &bad.expect,
            stream_says,
            &shown,
            &what("NpyFile::read_all"),
        );

        let bytes = std::fs::read(&path).unwrap();
        let err = NpyView::new(&bytes, &limits).unwrap_err();
        check(&err, &bad.expect, says, "<memory>", &what("NpyView::new"));
        assert_eq!(err.file(), None);
        let err = NpyView::new_named(&bytes, &limits, &path).unwrap_err();
        check(&err, &bad.expect, says, &shown, &what("NpyView::new_named"));
        let err = read_stream(&bytes[..], &limits, Some(Path::new("s.npy"))).unwrap_err();
        check(
            &err,
            &bad.expect,
            stream_says,
            "s.npy",
            &what("read_stream"),
        );
    }
}

/// Counts the bytes taken from a reader.
struct Counting<'a> {
    inner: &'a [u8],
    taken: usize,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n;
        Ok(n)
    }
}

#[test]
fn object_dtype_is_refused_before_the_payload_is_touched() {
    let fixtures = generate();
    let bytes = std::fs::read(fixtures.path("object_pickle.npy")).unwrap();
    let header_end = 10 + usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    assert!(
        bytes.len() > header_end,
        "the fixture carries a pickle payload"
    );
    let mut reader = Counting {
        inner: &bytes,
        taken: 0,
    };
    let err = read_stream(&mut reader, &Limits::default(), None).unwrap_err();
    assert_eq!(kind(&err), "ObjectDtype");
    assert_eq!(
        reader.taken, header_end,
        "the stream was read past the header"
    );
    // The header alone suffices: the payload need not even be there.
    let err = NpyView::new(&bytes[..header_end], &Limits::default()).unwrap_err();
    assert_eq!(kind(&err), "ObjectDtype");
}

#[test]
fn bounds_are_checked_before_allocation() {
    let limits = Limits::default().with_max_bytes(1 << 20);
    let bytes = npy_bytes(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (1024, 1024), }",
        &[],
    );
    let err = read_stream(&bytes[..], &limits, None).unwrap_err();
    assert_eq!(kind(&err), "LimitExceeded");
    assert_eq!(
        err.to_string(),
        "<memory>: byte size 8388608 of shape (1024, 1024) exceeds the limit of 1048576"
    );
    let limits = Limits::default().with_max_elements(1000);
    let err = NpyView::new(&bytes, &limits).unwrap_err();
    assert_eq!(kind(&err), "LimitExceeded");
    // Within the bounds the missing payload is what is refused.
    let err = read_stream(&bytes[..], &Limits::default(), None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "<memory>: payload truncated: 0 bytes present, 8388608 declared"
    );
}

#[test]
fn bad_regions_are_refused() {
    let payload: Vec<u8> = (0..24).collect();
    let bytes = npy_bytes(
        "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }",
        &payload,
    );
    let view = NpyView::new(&bytes, &Limits::default()).unwrap();
    let mut out = vec![0u8; 4];
    let err = view.read_region(&[0, 0], &[1, 5], &mut out).unwrap_err();
    assert_eq!(kind(&err), "InvalidRegion");
    assert_eq!(
        err.to_string(),
        "<memory>: region [0, 0]..[1, 5] is outside shape (3, 4): a stop exceeds its axis"
    );
    let err = view.read_region(&[2, 0], &[1, 4], &mut out).unwrap_err();
    assert!(
        err.to_string().contains("a start exceeds its stop"),
        "{err}"
    );
    let err = view.read_region(&[0], &[1], &mut out).unwrap_err();
    assert!(err.to_string().contains("its rank differs"), "{err}");
    let err = view.read_region(&[0, 0], &[1, 3], &mut out).unwrap_err();
    assert_eq!(kind(&err), "OutputSize");
    assert_eq!(
        err.to_string(),
        "<memory>: output buffer holds 4 bytes but the region needs 6"
    );
    assert!(view.region_runs(&[0, 0], &[4, 4]).is_err());

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.npy");
    std::fs::write(&path, &bytes).unwrap();
    let file = NpyFile::open(&path, &Limits::default()).unwrap();
    let err = file.read_region(&[0, 0], &[1, 5], &mut out).unwrap_err();
    assert_eq!(kind(&err), "InvalidRegion");
    assert!(
        err.to_string()
            .starts_with(&format!("{}: region", path.display()))
    );
    let err = file.read_region(&[0, 0], &[1, 1], &mut out).unwrap_err();
    assert_eq!(kind(&err), "OutputSize");
}

#[test]
fn only_regular_files_are_opened() {
    let dir = tempfile::tempdir().unwrap();
    let err = NpyFile::open(dir.path(), &Limits::default()).unwrap_err();
    assert_eq!(kind(&err), "NotAFile");
    assert!(
        err.to_string().contains("not a regular file (a directory)"),
        "{err}"
    );
    // A FIFO must be refused without blocking on open.
    let fifo = dir.path().join("pipe.npy");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = NpyFile::open(&fifo, &Limits::default()).unwrap_err();
    assert!(
        err.to_string().contains("not a regular file (a FIFO)"),
        "{err}"
    );
    let err = NpyFile::read_all(&fifo, &Limits::default()).unwrap_err();
    assert_eq!(kind(&err), "NotAFile");
    let err = NpyFile::open(&dir.path().join("absent.npy"), &Limits::default()).unwrap_err();
    assert_eq!(kind(&err), "Io");
    assert!(err.to_string().contains("absent.npy: open: "), "{err}");
}
