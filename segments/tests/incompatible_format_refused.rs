//! A directory written by another format version is refused with a clear message and left
//! exactly as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_segments::{FORMAT_VERSION, Store, StoreError, StoreOptions};

#[test]
fn incompatible_format_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    drop(Store::open(StoreOptions::new(dir)).unwrap());
    let other = format!("tessera-segments {}\n", FORMAT_VERSION + 1);
    std::fs::write(dir.join("FORMAT"), &other).unwrap();
    std::fs::write(
        dir.join("segments/seg_0000000000000000.arrow"),
        b"old bytes",
    )
    .unwrap();

    let err = Store::open(StoreOptions::new(dir)).unwrap_err();
    assert!(
        matches!(err, StoreError::IncompatibleFormat { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.canonicalize().unwrap().display().to_string()),
        "{msg}"
    );
    assert!(msg.contains(&(FORMAT_VERSION + 1).to_string()), "{msg}");
    assert_eq!(std::fs::read_to_string(dir.join("FORMAT")).unwrap(), other);
    assert_eq!(
        std::fs::read(dir.join("segments/seg_0000000000000000.arrow")).unwrap(),
        b"old bytes"
    );
}
