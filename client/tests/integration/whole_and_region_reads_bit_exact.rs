//! Whole tensors and regions read bit-exact, through the mmap fast path and
//! through DoGet, for several dtypes (big-endian included) and ranks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, crop, npy_fixture, options};
use tessera_client::{Client, Region, itemsize, parse_region};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_and_region_reads_are_bit_exact_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = [
        npy_fixture(dir.path(), "plane", "<u2", &[300, 500], 1),
        npy_fixture(dir.path(), "volume", ">i2", &[20, 40, 70], 2),
        npy_fixture(dir.path(), "line", "|u1", &[200_001], 3),
        npy_fixture(dir.path(), "floats", "<f8", &[3, 7, 11, 13], 4),
    ];
    let shapes: [&[u64]; 4] = [&[300, 500], &[20, 40, 70], &[200_001], &[3, 7, 11, 13]];
    let dtypes = ["<u2", ">i2", "|u1", "<f8"];
    let names = ["plane", "volume", "line", "floats"];
    let paths: Vec<_> = fixtures.iter().map(|(p, _)| p.clone()).collect();
    let server = Server::start(&paths, &["--chunk-target", "64KiB"]);

    for mmap in [true, false] {
        let client = Client::connect(&server.url, options(mmap)).await.unwrap();
        for (i, name) in names.iter().enumerate() {
            let (shape, data, dtype) = (shapes[i], &fixtures[i].1, dtypes[i]);
            let whole = client.read(name, None).await.unwrap();
            assert_eq!(whole.shape, shape, "{name} shape (mmap {mmap})");
            assert_eq!(whole.dtype, dtype, "{name} dtype");
            assert!(
                whole.bytes == *data,
                "{name} whole read differs (mmap {mmap})"
            );

            let size = itemsize(dtype).unwrap();
            let regions = match shape.len() {
                1 => vec!["5:77777", "123456:", "-1", "100:101"],
                2 => vec!["3:250,17:499", "299,:", ":,1:2", "100:200,250:"],
                3 => vec!["1:19,5:35,3:67", "7,:,:", ":,39,:", "0:1,0:1,0:1"],
                _ => vec!["1:3,2:6,5:9,1:12", "2,6,10,12"],
            };
            for text in regions {
                let region: Region = parse_region(text, shape).unwrap();
                let got = client.read(name, Some(&region)).await.unwrap();
                assert_eq!(got.shape, region.shape(), "{name}[{text}] shape");
                assert!(
                    got.bytes == crop(data, shape, size, &region),
                    "{name}[{text}] differs (mmap {mmap})"
                );
            }
        }
        let plan = client.plan("plane", None).await.unwrap();
        assert!(plan.chunks.len() > 1, "64KiB target splits the plane");
        let stats = client.local_stats();
        if mmap {
            assert!(stats.mapped_chunks > 0, "{stats:?}");
            assert_eq!(stats.socket_chunks, 0, "{stats:?}");
        } else {
            assert_eq!(stats.locate_probes, 0, "{stats:?}");
            assert_eq!(stats.mapped_chunks + stats.mapped_copies, 0, "{stats:?}");
            assert!(stats.socket_chunks > 0, "{stats:?}");
        }
    }
}
