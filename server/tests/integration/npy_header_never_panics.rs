//! Random mutations of valid files and random header text never make the reader panic, and
//! whatever it accepts satisfies the header's invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::npy_support::{Rng, npy_bytes};
use proptest::prelude::*;
use tessera_server::npy::{Dtype, Header, Limits, NpyView, parse_header};

/// Valid files to mutate: several dtypes, ranks, orders and header versions.
fn seeds() -> Vec<Vec<u8>> {
    let payload: Vec<u8> = (0..=255u8).cycle().take(2048).collect();
    let mut seeds = vec![
        npy_bytes(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 8), }",
            &payload[..256],
        ),
        npy_bytes(
            "{'descr': '>i2', 'fortran_order': True, 'shape': (3, 5, 7), }",
            &payload[..210],
        ),
        npy_bytes(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 9), }",
            &[],
        ),
        npy_bytes(
            "{'descr': '<c16', 'fortran_order': True, 'shape': (2, 3, 2, 2), }",
            &payload[..768],
        ),
        npy_bytes(
            "{'shape': (17,), 'descr': '|b1', 'fortran_order': False}",
            &payload[..17],
        ),
        npy_bytes(
            "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
            b"\x80\x04N.",
        ),
    ];
    // Versions 2.0 and 3.0: the same dict behind a 4-byte length field.
    let dict = b"{'descr': '<u4', 'fortran_order': False, 'shape': (2, 2, 2), }";
    for major in [2u8, 3] {
        let mut text = dict.to_vec();
        while !(12 + text.len() + 1).is_multiple_of(64) {
            text.push(b' ');
        }
        text.push(b'\n');
        let mut bytes = b"\x93NUMPY".to_vec();
        bytes.extend([major, 0]);
        bytes.extend(u32::try_from(text.len()).unwrap().to_le_bytes());
        bytes.extend(text);
        bytes.extend_from_slice(&payload[..32]);
        seeds.push(bytes);
    }
    seeds
}

/// What every accepted header must satisfy.
fn check_invariants(header: &Header, limits: &Limits) {
    assert!(!header.shape.is_empty());
    let count = header
        .shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .unwrap();
    assert_eq!(header.data_len, count * header.dtype.itemsize as u64);
    assert!(count <= limits.max_elements && header.data_len <= limits.max_bytes);
    assert_eq!(header.data_offset % 16, 0);
    assert_eq!(
        Dtype::parse(&header.dtype.numpy_str()).unwrap(),
        header.dtype
    );
}

/// Reads a few regions of an accepted view; C-order runs must agree with the copies.
fn exercise(view: &NpyView<'_>, seed: u64) {
    let header = view.header();
    let mut rng = Rng::new(seed);
    let zeros = vec![0; header.shape.len()];
    let mut whole = vec![0u8; header.data_len as usize];
    view.read_region(&zeros, &header.shape, &mut whole).unwrap();
    if header.is_c_layout() {
        assert_eq!(whole, view.payload());
    }
    for _ in 0..4 {
        let (start, stop) = rng.region(&header.shape);
        let bytes: u64 = start.iter().zip(&stop).map(|(a, b)| b - a).product::<u64>()
            * header.dtype.itemsize as u64;
        let mut out = vec![0u8; bytes as usize];
        view.read_region(&start, &stop, &mut out).unwrap();
        if let Some(runs) = view.region_runs(&start, &stop).unwrap() {
            assert_eq!(runs.collect::<Vec<_>>().concat(), out);
        }
    }
}

/// Bytes that keep a mutated header close to the grammar.
const PUNCTUATION: &[u8] = b" ,(){}:'-0123456789TF";

/// Tokens numpy headers, and attacks on them, are made of.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\n",
    "'descr'",
    "'fortran_order'",
    "'shape'",
    "'<f8'",
    "'>i2'",
    "'|u1'",
    "'|O'",
    "'<U7'",
    "\"<c8\"",
    "True",
    "False",
    "0",
    "1",
    "7",
    "-1",
    "18446744073709551616",
    "4294967296",
    "3L",
    "None",
    "__import__('os')",
    "'",
    "\"",
    "\\",
    "\u{e9}",
    "\0",
    "'foo'",
    "1e3",
    "0x10",
];

fn header_from_tokens(tokens: &[usize], major: u8) -> Vec<u8> {
    let mut text: Vec<u8> = tokens.iter().flat_map(|&t| TOKENS[t].bytes()).collect();
    let fixed = if major == 1 { 10 } else { 12 };
    while !(fixed + text.len() + 1).is_multiple_of(64) {
        text.push(b' ');
    }
    text.push(b'\n');
    let mut bytes = b"\x93NUMPY".to_vec();
    bytes.extend([major, 0]);
    if major == 1 {
        bytes.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
    } else {
        bytes.extend(u32::try_from(text.len()).unwrap().to_le_bytes());
    }
    bytes.extend(text);
    bytes.extend(std::iter::repeat_n(0u8, 64));
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(
        seed in 0usize..8,
        edits in prop::collection::vec((0u8..5, any::<u16>(), any::<u8>()), 0..10),
        cut in prop::option::of(any::<u16>()),
        small_limits in any::<bool>(),
    ) {
        let mut bytes = seeds()[seed].clone();
        for (op, at, value) in edits {
            let at = usize::from(at) % (bytes.len() + 1);
            match op {
                0 if at < bytes.len() => bytes[at] = value,
                1 => bytes.insert(at, value),
                2 if at < bytes.len() => { bytes.remove(at); }
                3 if at < bytes.len() => bytes[at] ^= 1 << (value % 8),
                4 if at < bytes.len() => bytes[at] = PUNCTUATION[usize::from(value) % PUNCTUATION.len()],
                _ => {}
            }
        }
        if let Some(cut) = cut {
            bytes.truncate(usize::from(cut) % (bytes.len() + 1));
        }
        let limits = if small_limits {
            Limits::default().with_max_header_len(100).with_max_bytes(300).with_max_elements(100)
        } else {
            Limits::default()
        };
        if let Ok(header) = parse_header(&bytes, &limits) {
            check_invariants(&header, &limits);
        }
        if let Ok(view) = NpyView::new(&bytes, &limits) {
            check_invariants(view.header(), &limits);
            exercise(&view, bytes.len() as u64);
        }
    }

    #[test]
    fn token_soup_headers_never_panic(
        tokens in prop::collection::vec(0usize..TOKENS.len(), 0..30),
        major in 1u8..4,
    ) {
        let bytes = header_from_tokens(&tokens, major);
        let limits = Limits::default();
        if let Ok(header) = parse_header(&bytes, &limits) {
            check_invariants(&header, &limits);
        }
        if let Ok(view) = NpyView::new(&bytes, &limits) {
            exercise(&view, 7);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut with_magic = b"\x93NUMPY\x01\x00".to_vec();
        with_magic.extend_from_slice(&bytes);
        for candidate in [&bytes, &with_magic] {
            let limits = Limits::default();
            if let Ok(header) = parse_header(candidate, &limits) {
                check_invariants(&header, &limits);
            }
            if let Ok(view) = NpyView::new(candidate, &limits) {
                exercise(&view, 11);
            }
        }
    }
}

#[test]
fn seeds_are_valid_except_the_object_one() {
    let limits = Limits::default();
    for (i, seed) in seeds().iter().enumerate() {
        let result = NpyView::new(seed, &limits);
        if i == 5 {
            assert!(result.is_err());
        } else {
            exercise(&result.unwrap(), 3);
        }
    }
}
