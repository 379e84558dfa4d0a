//! Fuzzes the `.npy` header parser and the borrowed view: no input may panic, and whatever
//! is accepted must read back consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_server::source::npy::{Limits, NpyView, parse_header};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default().with_max_bytes(1 << 24);
    let parsed = parse_header(data, &limits);
    let Ok(view) = NpyView::new(data, &limits) else {
        return;
    };
    // A view that opens has a header the pure parser accepts identically.
    assert_eq!(parsed.as_ref().ok(), Some(view.header()));
    let header = view.header();
    let zeros = vec![0u64; header.shape.len()];
    let mut whole = vec![0u8; view.payload().len()];
    if view.read_region(&zeros, &header.shape, &mut whole).is_err() {
        panic!("the whole array of an accepted view must be readable");
    }
    if header.is_c_layout() {
        assert_eq!(whole.as_slice(), view.payload());
    }
    // The upper half of every axis, through runs and through the copying read.
    let start: Vec<u64> = header.shape.iter().map(|d| d / 2).collect();
    let bytes: u64 = header
        .shape
        .iter()
        .zip(&start)
        .map(|(d, s)| d - s)
        .product::<u64>()
        * header.dtype.itemsize as u64;
    let mut half = vec![0u8; bytes as usize];
    if view.read_region(&start, &header.shape, &mut half).is_err() {
        panic!("an in-bounds region of an accepted view must be readable");
    }
    if let Ok(Some(runs)) = view.region_runs(&start, &header.shape) {
        assert_eq!(runs.collect::<Vec<_>>().concat(), half);
    }
});
