//! `tessera get` writes a `.npy` that numpy loads equal to the source (whole and
//! regions, little- and big-endian), through both paths. Regions follow numpy: negative
//! indices, an integer index drops its axis, a reversed slice is an empty axis.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_cli::remote::{Credentials, get as cli_get};
use tessera_test_support::npy_fixture;
use tessera_test_support::process::{ServerProcess, run_cli};

fn python() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        path.is_file(),
        "the project venv with numpy is missing at {}",
        path.display()
    );
    path
}

/// Asserts with numpy that `out` equals `source[index]` in dtype, shape and values.
fn numpy_agrees(source: &Path, out: &Path, index: &str) {
    let script = format!(
        "import numpy as np, sys\n\
         src = np.load(sys.argv[1])[{index}]\n\
         out = np.load(sys.argv[2])\n\
         assert out.dtype == src.dtype, (out.dtype, src.dtype)\n\
         assert out.shape == src.shape, (out.shape, src.shape)\n\
         assert out.flags.c_contiguous\n\
         assert out.tobytes() == np.ascontiguousarray(src).tobytes()\n\
         print('ok')\n"
    );
    let output = Command::new(python())
        .args(["-c", &script])
        .arg(source)
        .arg(out)
        .output()
        .unwrap();
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == "ok",
        "numpy disagrees for [{index}]: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_writes_npy_that_numpy_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (plane, _) = npy_fixture(dir.path(), "plane", "<u2", &[300, 400], 41);
    let (volume, _) = npy_fixture(dir.path(), "volume", ">i4", &[12, 50, 60], 42);
    let (line, _) = npy_fixture(dir.path(), "line", "<c8", &[5000], 43);
    // Both grids (docs/decisions/0015): 64 KiB cells alone, and 256 KiB cells for loopback
    // plans pinned beside them, the grid `tessera get` maps on a daemon's defaults.
    let grids: [(&str, &[&str]); 2] = [
        ("fine", &[]),
        (
            "coarse",
            &[
                "--mapped-chunk-target",
                "256KiB",
                "--loopback-plans",
                "mapped",
            ],
        ),
    ];
    for (grid, flags) in grids {
        let cache = dir.path().join(format!("cache-{grid}"));
        let mut args = vec![
            plane.as_os_str(),
            volume.as_os_str(),
            line.as_os_str(),
            "--cache-dir".as_ref(),
            cache.as_os_str(),
            "--chunk-target".as_ref(),
            "64KiB".as_ref(),
        ];
        args.extend(flags.iter().map(std::ffi::OsStr::new));
        let server = ServerProcess::spawn(&args);
        let location = server.url().replacen("http://", "grpc://", 1);
        get_every_case(&dir, &location, [&plane, &volume, &line], grid).await;
    }
}

/// `tessera get` of whole tensors and regions over both routes, each checked by numpy.
async fn get_every_case(
    dir: &tempfile::TempDir,
    location: &str,
    [plane, volume, line]: [&Path; 3],
    grid: &str,
) {
    // (array id, source, region for tessera get, the same index in numpy)
    let cases: [(&str, &Path, Option<&str>, &str); 11] = [
        ("plane", plane, None, ":"),
        ("plane", plane, Some("10:290,:-7"), "10:290, :-7"),
        ("plane", plane, Some("5"), "5"),
        ("plane", plane, Some("5,:"), "5, :"),
        ("plane", plane, Some("10:5,:"), "10:5, :"),
        ("volume", volume, Some(":,-1,3"), ":, -1, 3"),
        ("volume", volume, Some("2,40:10"), "2, 40:10"),
        ("volume", volume, None, ":"),
        ("volume", volume, Some("3:9,:,40:"), "3:9, :, 40:"),
        ("line", line, Some("-100:"), "-100:"),
        ("line", line, None, ":"),
    ];
    for no_mmap in [false, true] {
        for (i, (id, source, region, index)) in cases.iter().enumerate() {
            let out = dir.path().join(format!("out_{grid}_{i}_{no_mmap}.npy"));
            let summary = cli_get(
                location,
                id,
                *region,
                None,
                &out,
                no_mmap,
                Credentials::default(),
            )
            .await
            .unwrap();
            assert_eq!(summary.path, out);
            if i == 0 {
                // The whole 240,000-byte plane: 4 cells of 81 rows, or one 256 KiB cell.
                let cells = if grid == "coarse" { 1 } else { 4 };
                assert_eq!(summary.chunks, cells, "{grid} grid: {summary}");
            }
            // An empty selection is written without asking for a chunk.
            assert_eq!(summary.chunks == 0, summary.bytes == 0, "{summary}");
            if no_mmap {
                assert_eq!(summary.mapped_chunks + summary.mapped_copies, 0);
            } else {
                assert_eq!(summary.socket_chunks, 0);
            }
            numpy_agrees(source, &out, index);
        }
    }

    // The binary itself: a region starting with '-' is a value, not a flag.
    let out = dir.path().join(format!("tail_{grid}.npy"));
    let run = run_cli(
        &[
            "get",
            location,
            "plane",
            "--region",
            "-10:,:",
            "-o",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("'plane' (10, 400) <u2"),
        "{}",
        run.stdout
    );
    numpy_agrees(plane, &out, "-10:, :");
}
