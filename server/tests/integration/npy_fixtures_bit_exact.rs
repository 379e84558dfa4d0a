//! Every numpy-made fixture, and many random regions of each, read bit-exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use crate::npy_support::{Rng, generate, naive_region};
use tessera_server::npy::{
    Limits, NpyFile, NpyView, parse_header, read_stream, region_is_contiguous,
};

const REGIONS_PER_FIXTURE: usize = 40;

#[test]
fn every_fixture_reads_bit_exact() {
    let fixtures = generate();
    let limits = Limits::default();
    let mut rng = Rng::new(0x5eed_1234);
    let mut regions = 0usize;
    for good in &fixtures.manifest.good {
        let path = fixtures.path(&good.file);
        let raw = std::fs::read(fixtures.path(&good.raw)).unwrap();
        let what = format!("{} ({} {:?})", good.file, good.dtype, good.shape);

        let file = NpyFile::open(&path, &limits).unwrap();
        let header = file.header().clone();
        assert_eq!(header.dtype.numpy_str(), good.dtype, "{what}");
        assert_eq!(header.shape, good.shape, "{what}");
        assert_eq!(header.fortran_order, good.fortran, "{what}");
        assert_eq!(
            vec![header.version.0, header.version.1],
            good.version,
            "{what}"
        );
        assert_eq!(header.data_len, raw.len() as u64, "{what}");

        let (all_header, all) = NpyFile::read_all(&path, &limits).unwrap();
        assert_eq!(all_header, header, "{what}");
        assert!(all == raw, "{what}: read_all differs");

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(parse_header(&bytes, &limits).unwrap(), header, "{what}");
        let (_, streamed) = read_stream(&bytes[..], &limits, None).unwrap();
        assert!(streamed == raw, "{what}: read_stream differs");
        let view = NpyView::new(&bytes, &limits).unwrap();
        assert_eq!(view.header(), &header, "{what}");
        if !good.fortran {
            assert!(view.payload() == &raw[..], "{what}: payload differs");
        }

        let zeros = vec![0u64; good.shape.len()];
        let mut out = vec![0u8; raw.len()];
        file.read_region(&zeros, &good.shape, &mut out).unwrap();
        assert!(out == raw, "{what}: whole-array region via file differs");
        out.fill(0);
        view.read_region(&zeros, &good.shape, &mut out).unwrap();
        assert!(out == raw, "{what}: whole-array region via view differs");

        for _ in 0..REGIONS_PER_FIXTURE {
            let (start, stop) = rng.region(&good.shape);
            let expected = naive_region(&raw, &good.shape, header.dtype.itemsize, &start, &stop);
            let at = format!("{what} region {start:?}..{stop:?}");
            let mut out = vec![0xa5u8; expected.len()];
            file.read_region(&start, &stop, &mut out).unwrap();
            assert!(out == expected, "{at}: file read differs");
            out.fill(0x5a);
            view.read_region(&start, &stop, &mut out).unwrap();
            assert!(out == expected, "{at}: view read differs");
            match view.region_runs(&start, &stop).unwrap() {
                Some(runs) => {
                    let runs: Vec<&[u8]> = runs.collect();
                    assert!(runs.concat() == expected, "{at}: runs differ");
                    if region_is_contiguous(&good.shape, &start, &stop) {
                        assert!(
                            runs.len() <= 1,
                            "{at}: contiguous region in {} runs",
                            runs.len()
                        );
                    } else {
                        assert!(runs.len() > 1, "{at}: split region in {} run", runs.len());
                    }
                }
                None => assert!(
                    header.fortran_order && !header.is_c_layout(),
                    "{at}: no runs"
                ),
            }
            regions += 1;
        }
    }
    assert!(regions >= 40 * 250, "only {regions} regions were checked");
}

#[test]
fn fixtures_cover_the_contract() {
    let fixtures = generate();
    let good = &fixtures.manifest.good;
    let dtypes: BTreeSet<&str> = good.iter().map(|g| g.dtype.as_str()).collect();
    let mut expected = BTreeSet::new();
    for (kind, sizes) in [
        ("b", &[1][..]),
        ("i", &[1, 2, 4, 8]),
        ("u", &[1, 2, 4, 8]),
        ("f", &[2, 4, 8]),
        ("c", &[8, 16]),
    ] {
        for size in sizes {
            if *size == 1 {
                expected.insert(format!("|{kind}{size}"));
            } else {
                expected.insert(format!("<{kind}{size}"));
                expected.insert(format!(">{kind}{size}"));
            }
        }
    }
    let expected: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(dtypes, expected);
    for dtype in &expected {
        for rank in 1..=6 {
            assert!(
                good.iter()
                    .any(|g| g.dtype == *dtype && g.shape.len() == rank && !g.fortran),
                "{dtype} rank {rank} C order"
            );
        }
        assert!(
            good.iter().any(|g| g.dtype == *dtype && g.fortran),
            "{dtype} Fortran order"
        );
    }
    for major in 1..=3 {
        assert!(
            good.iter().any(|g| g.version == [major, 0]),
            "version {major}.0"
        );
    }
    assert!(
        good.iter().any(|g| g.shape.contains(&0) && g.fortran),
        "empty Fortran array"
    );
    assert!(
        good.iter().filter(|g| g.shape.contains(&0)).count() >= 5,
        "empty arrays"
    );
}

#[test]
fn trailing_bytes_are_ignored() {
    let fixtures = generate();
    let limits = Limits::default();
    let good = fixtures
        .manifest
        .good
        .iter()
        .find(|g| g.file == "big_c_le_f8.npy")
        .unwrap();
    let raw = std::fs::read(fixtures.path(&good.raw)).unwrap();
    let mut bytes = std::fs::read(fixtures.path(&good.file)).unwrap();
    bytes.extend_from_slice(b"trailing junk that numpy ignores");
    let view = NpyView::new(&bytes, &limits).unwrap();
    assert!(view.payload() == &raw[..]);
    let path = fixtures.path("with_trailing.npy");
    std::fs::write(&path, &bytes).unwrap();
    let (_, all) = NpyFile::read_all(&path, &limits).unwrap();
    assert!(all == raw);
    let file = NpyFile::open(&path, &limits).unwrap();
    let mut out = vec![0u8; raw.len()];
    file.read_region(&[0, 0, 0], &good.shape, &mut out).unwrap();
    assert!(out == raw);
}

#[test]
fn non_finite_floats_are_carried() {
    let fixtures = generate();
    let limits = Limits::default();
    let good = fixtures
        .manifest
        .good
        .iter()
        .find(|g| g.file == "c_le_f8_r1.npy")
        .unwrap();
    let (_, data) = NpyFile::read_all(&fixtures.path(&good.file), &limits).unwrap();
    let values: Vec<f64> = data
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(values.iter().any(|v| v.is_nan()));
    assert!(values.contains(&f64::INFINITY));
    assert!(values.contains(&f64::NEG_INFINITY));
    assert!(values.iter().any(|v| *v == 0.0 && v.is_sign_negative()));
}
