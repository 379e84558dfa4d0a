//! pyarrow reads every entry exactly as the biopb client does (memory_map, open_stream schema,
//! seek, read_message, read_record_batch, np.frombuffer of the data values buffer), both while
//! the segment is open and after it is sealed; a sealed segment iterates fully.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

const SCRIPT: &str = r#"
import sys, numpy as np, pyarrow as pa
manifest, mode = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(manifest) if l.strip()]
for path, off, dtype, shape, expected, key in rows:
    off = int(off)
    shape = [int(s) for s in shape.split(",")] if shape else []
    mm = pa.memory_map(path)
    schema = pa.ipc.open_stream(mm).schema
    mm.seek(off)
    msg = pa.ipc.read_message(mm)
    b = pa.ipc.read_record_batch(msg, schema)
    assert b.num_rows == 1, (path, off, b.num_rows)
    buf = b.column("data").buffers()[2]
    assert buf.address % 64 == 0, ("payload not 64-byte aligned", path, off, buf.address % 64)
    count = int(np.prod(shape)) if shape else 1
    got = np.frombuffer(buf, dtype, count=count).reshape(shape)
    want = np.frombuffer(open(expected, "rb").read(), dtype).reshape(shape)
    # Compare bytes (random float bit patterns include NaNs, which never compare equal).
    assert got.tobytes() == want.tobytes(), ("bytes differ", path, off)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert b.column("shape")[0].as_py() == shape, (b.column("shape")[0], shape)
    assert b.column("dtype")[0].as_py() == dtype
    assert b.column("key")[0].as_py() == bytes.fromhex(key)
if mode == "sealed":
    for path in sorted({r[0] for r in rows}):
        with pa.memory_map(path) as mm:
            reader = pa.ipc.open_stream(mm)
            n = sum(1 for _ in reader)
        want = sum(1 for r in rows if r[0] == path)
        assert n == want, ("stream iteration", path, n, want)
print("ok", len(rows))
"#;

fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = std::env::var_os("TESSERA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    assert!(
        py.exists(),
        "python with pyarrow+numpy not found at {} (set TESSERA_PYTHON or create the workspace \
         .venv); this test needs it",
        py.display()
    );
    py
}

fn run_python(dir: &std::path::Path, manifest: &str, mode: &str) {
    let mpath = dir.join(format!("manifest-{mode}.tsv"));
    std::fs::write(&mpath, manifest).unwrap();
    let spath = dir.join("check.py");
    std::fs::File::create(&spath)
        .unwrap()
        .write_all(SCRIPT.as_bytes())
        .unwrap();
    let out = Command::new(python())
        .arg(&spath)
        .arg(&mpath)
        .arg(mode)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyarrow check ({mode}) failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pyarrow_reads_every_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("cache");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // Small segments so entries spread over several of them.
    let store = Store::open(
        StoreOptions::new(&store_dir)
            .with_segment_bytes(256 << 10)
            .with_open_segments(2),
    )
    .unwrap();

    let cases: Vec<(Vec<i64>, &str, usize)> = vec![
        (vec![16, 16], "<u2", 2),
        (vec![7, 3, 5], "|u1", 1),
        (vec![33, 9], ">i2", 2),
        (vec![100, 100], "<f4", 4),
        (vec![1], "<f8", 8),
        (vec![3, 0], "<u2", 2),
        (vec![128, 300], "|u1", 1),
        (vec![5, 5, 5, 5], ">f8", 8),
        (vec![257, 129], "<i4", 4),
        (vec![2], "<c8", 8),
    ];
    let mut manifest = String::new();
    for round in 0..3u64 {
        for (i, (shape, dtype, item)) in cases.iter().enumerate() {
            let n: i64 = shape.iter().product();
            let seed = round * 100 + i as u64;
            let data = pattern(seed, n as usize * item);
            let key = format!("k-{round}-{i}").into_bytes();
            // Split the bytes in several pieces (vectored write).
            let (a, rest) = data.split_at(data.len() / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            let loc = store.append(&key, &meta(shape, dtype), &[a, b, c]).unwrap();
            assert_ne!(loc.byte_offset, 0);
            let expected = work.join(format!("e{seed}.bin"));
            std::fs::write(&expected, &data).unwrap();
            let shape_s: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            let key_hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            manifest.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\n",
                loc.segment_path.display(),
                loc.byte_offset,
                dtype,
                shape_s.join(","),
                expected.display(),
                key_hex
            ));
        }
    }
    assert!(store.stats().segments >= 2, "entries should span segments");
    // Open segments (no end-of-stream yet) are read exactly like sealed ones.
    run_python(&work, &manifest, "open");
    store.close().unwrap();
    run_python(&work, &manifest, "sealed");
}
