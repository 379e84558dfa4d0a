//! The chunk id codec: a pinned compatibility vector, round trips, refusals,
//! and decoding of hostile bytes without panics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use tessera_server::Region;
use tessera_server::{ChunkId, ChunkIdError, FileVersion as ContentVersion};
use tessera_server::{Method, Scale};

/// The pinned encoding of the vector below. If this test fails, the wire
/// format changed: existing client caches would map old ids to new bytes.
const PINNED_HEX: &str = concat!(
    "5453",             // magic "TS"
    "01",               // version 1
    "0003",             // array id length
    "696d67",           // "img"
    "0000000000000001", // dev
    "0000000000000002", // ino
    "0000000000000003", // size
    "0000000000000004", // mtime_ns
    "02",               // 2 axes
    "0000000000000000", // start[0]
    "0000000000000010", // start[1]
    "0000000000000010", // stop[0]
    "0000000000000020", // stop[1]
);

/// The pinned encoding of a scaled chunk (format version 2): the same block reduced by
/// (2, 4) with `area`. Version 1's fields, then the factors and the method byte.
const PINNED_SCALED_HEX: &str = concat!(
    "5453",             // magic "TS"
    "02",               // version 2: scaled
    "0003",             // array id length
    "696d67",           // "img"
    "0000000000000001", // dev
    "0000000000000002", // ino
    "0000000000000003", // size
    "0000000000000004", // mtime_ns
    "02",               // 2 axes
    "0000000000000000", // start[0]
    "0000000000000010", // start[1]
    "0000000000000010", // stop[0]
    "0000000000000020", // stop[1]
    "0000000000000002", // scale[0]
    "0000000000000004", // scale[1]
    "02",               // method: area
);

fn version() -> ContentVersion {
    ContentVersion {
        dev: 1,
        ino: 2,
        size: 3,
        mtime_ns: 4,
    }
}

fn pinned() -> ChunkId {
    ChunkId::new("img", version(), Region::new(vec![0, 16], vec![16, 32])).unwrap()
}

fn err(bytes: &[u8]) -> ChunkIdError {
    ChunkId::decode(bytes).unwrap_err()
}

#[test]
fn pinned_compatibility_vector() {
    let id = pinned();
    let bytes = id.encode();
    assert_eq!(hex::encode(&bytes), PINNED_HEX);
    assert_eq!(bytes.len(), 73);
    assert_eq!(id.segment_key(), bytes);
    let back = ChunkId::decode(&hex::decode(PINNED_HEX).unwrap()).unwrap();
    assert_eq!(back, id);
    assert_eq!(back.array_id(), "img");
    assert_eq!(back.version(), version());
    assert_eq!(back.region(), &Region::new(vec![0, 16], vec![16, 32]));
}

fn pinned_scaled(method: Method) -> ChunkId {
    let scale = Scale::new(vec![2, 4], method).unwrap();
    ChunkId::scaled(
        "img",
        version(),
        Region::new(vec![0, 16], vec![16, 32]),
        scale,
    )
    .unwrap()
}

#[test]
fn pinned_scaled_compatibility_vectors() {
    let id = pinned_scaled(Method::Area);
    let bytes = id.encode();
    assert_eq!(hex::encode(&bytes), PINNED_SCALED_HEX);
    assert_eq!(bytes.len(), 39 + 3 + 24 * 2);
    assert_eq!(ChunkId::decode(&bytes).unwrap(), id);
    // nearest differs in the last byte only.
    let nearest = pinned_scaled(Method::Nearest).encode();
    assert_eq!(nearest[..bytes.len() - 1], bytes[..bytes.len() - 1]);
    assert_eq!(nearest[bytes.len() - 1], 0x01);
    // A scaled chunk is its own cache entry, and the full-resolution id is unchanged.
    assert_ne!(id.segment_key(), pinned().segment_key());
    assert_eq!(hex::encode(id.with_scale(None).encode()), PINNED_HEX);
    assert_eq!(id.scale().unwrap().factors(), &[2, 4]);
    assert_eq!(id.scale().unwrap().method(), Method::Area);
}

#[test]
fn each_refusal_of_scaled_ids() {
    let good = pinned_scaled(Method::Area).encode();
    let scale_at = good.len() - 17;
    // Factor 0.
    let mut b = good.clone();
    b[scale_at..scale_at + 8].copy_from_slice(&0u64.to_be_bytes());
    assert_eq!(
        err(&b).to_string(),
        "chunk id has scale factor 0 on axis 0 (each factor must be at least 1)"
    );
    // All ones: that chunk's id is version 1.
    let mut b = good.clone();
    b[scale_at..scale_at + 8].copy_from_slice(&1u64.to_be_bytes());
    b[scale_at + 8..scale_at + 16].copy_from_slice(&1u64.to_be_bytes());
    assert_eq!(err(&b), ChunkIdError::TrivialScale);
    // Unknown method byte.
    let mut b = good.clone();
    *b.last_mut().unwrap() = 3;
    assert_eq!(
        err(&b).to_string(),
        "chunk id has unknown reduction method code 0x03"
    );
    // Truncated scale or method; a version 1 id carrying a scale has trailing bytes.
    assert!(matches!(
        err(&good[..good.len() - 1]),
        ChunkIdError::Truncated {
            field: "the reduction method",
            ..
        }
    ));
    assert!(matches!(
        err(&good[..good.len() - 5]),
        ChunkIdError::Truncated {
            field: "the scale factors",
            ..
        }
    ));
    let mut b = good.clone();
    b[2] = 1;
    assert_eq!(err(&b), ChunkIdError::Trailing(17));
    // A scale of another rank than the bounds.
    let scale = Scale::new(vec![2, 2, 2], Method::Nearest).unwrap();
    assert_eq!(
        ChunkId::scaled("img", version(), Region::new(vec![0, 0], vec![1, 1]), scale).unwrap_err(),
        ChunkIdError::ScaleRank { scale: 3, rank: 2 }
    );
}

#[test]
fn negative_mtime_and_extreme_values_round_trip() {
    let v = ContentVersion {
        dev: u64::MAX,
        ino: 0,
        size: u64::MAX,
        mtime_ns: i64::MIN,
    };
    let region = Region::new(vec![0; 32], vec![u64::MAX; 32]);
    let id = ChunkId::new("é/ü ☃".repeat(100), v, region).unwrap();
    assert_eq!(ChunkId::decode(&id.encode()).unwrap(), id);
}

#[test]
fn different_content_versions_give_different_ids() {
    let mut v = version();
    v.mtime_ns += 1;
    let other = ChunkId::new("img", v, Region::new(vec![0, 16], vec![16, 32])).unwrap();
    assert_ne!(other.encode(), pinned().encode());
}

#[test]
fn each_refusal_of_decode() {
    let good = pinned().encode();

    assert_eq!(
        err(&good[..3]).to_string(),
        "chunk id is 3 bytes: too short for the 'TS' header (5 bytes)"
    );
    assert_eq!(err(&[]), ChunkIdError::TooShort { len: 0 });

    let mut b = good.clone();
    b[0] = b'X';
    assert_eq!(
        err(&b).to_string(),
        "chunk id does not start with the 'TS' magic (found [58, 53])"
    );

    let mut b = good.clone();
    b[2] = 7;
    assert_eq!(err(&b).to_string(), "chunk id has unknown version 7");

    let mut b = good.clone();
    b[3..5].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(
        err(&b).to_string(),
        "chunk id array id is 0 bytes (must be 1..=1024)"
    );
    b[3..5].copy_from_slice(&1025u16.to_be_bytes());
    assert_eq!(err(&b), ChunkIdError::ArrayIdLength(1025));

    let mut b = good.clone();
    b[5] = 0xff;
    assert_eq!(err(&b).to_string(), "chunk id array id is not UTF-8");

    // Truncated inside each field.
    assert_eq!(
        err(&good[..7]).to_string(),
        "chunk id is truncated: the array id needs 3 bytes but 2 remain"
    );
    assert_eq!(
        err(&good[..20]).to_string(),
        "chunk id is truncated: the content version needs 8 bytes but 4 remain"
    );
    assert_eq!(
        err(&good[..40]).to_string(),
        "chunk id is truncated: the axis count needs 1 bytes but 0 remain"
    );
    assert_eq!(
        err(&good[..72]).to_string(),
        "chunk id is truncated: the chunk bounds needs 32 bytes but 31 remain"
    );

    let mut b = good[..41].to_vec();
    b[40] = 0;
    assert_eq!(err(&b).to_string(), "chunk id declares 0 axes (at least 1)");
    b[40] = 40;
    b.extend(std::iter::repeat_n(0u8, 16 * 40));
    assert_eq!(
        err(&b).to_string(),
        "chunk id declares 40 axes (at most 32)"
    );

    // start[1] = 5, stop[1] = 3.
    let mut b = good.clone();
    b[41 + 8..41 + 16].copy_from_slice(&5u64.to_be_bytes());
    b[41 + 24..41 + 32].copy_from_slice(&3u64.to_be_bytes());
    assert_eq!(
        err(&b).to_string(),
        "chunk id has start 5 > stop 3 on axis 1"
    );

    let mut b = good.clone();
    b.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(err(&b).to_string(), "chunk id has 4 trailing bytes");
}

#[test]
fn each_refusal_of_new() {
    let region = || Region::new(vec![0], vec![1]);
    assert_eq!(
        ChunkId::new("", version(), region()).unwrap_err(),
        ChunkIdError::ArrayIdLength(0)
    );
    assert_eq!(
        ChunkId::new("a".repeat(1025), version(), region()).unwrap_err(),
        ChunkIdError::ArrayIdLength(1025)
    );
    assert!(ChunkId::new("a".repeat(1024), version(), region()).is_ok());
    assert_eq!(
        ChunkId::new("a", version(), Region::new(vec![], vec![])).unwrap_err(),
        ChunkIdError::NoAxes
    );
    assert_eq!(
        ChunkId::new("a", version(), Region::new(vec![0; 33], vec![0; 33])).unwrap_err(),
        ChunkIdError::TooManyAxes(33)
    );
    assert_eq!(
        ChunkId::new("a", version(), Region::new(vec![0, 0], vec![1]))
            .unwrap_err()
            .to_string(),
        "chunk id region has 2 starts but 1 stops"
    );
    assert_eq!(
        ChunkId::new("a", version(), Region::new(vec![0, 5], vec![1, 3])).unwrap_err(),
        ChunkIdError::StartAfterStop {
            axis: 1,
            start: 5,
            stop: 3
        }
    );
}

fn any_id() -> impl Strategy<Value = ChunkId> {
    (
        "[a-zA-Z0-9_./é☃-]{1,40}",
        any::<(u64, u64, u64, i64)>(),
        prop::collection::vec((any::<u64>(), any::<u64>()), 1..=32),
    )
        .prop_map(|(name, (dev, ino, size, mtime_ns), bounds)| {
            let start = bounds.iter().map(|(a, b)| *a.min(b)).collect();
            let stop = bounds.iter().map(|(a, b)| *a.max(b)).collect();
            let v = ContentVersion {
                dev,
                ino,
                size,
                mtime_ns,
            };
            ChunkId::new(name, v, Region::new(start, stop)).unwrap()
        })
}

/// A scaled id: any id with factors of its rank (at least one above 1) and a method.
fn any_scaled_id() -> impl Strategy<Value = ChunkId> {
    (
        any_id(),
        prop::collection::vec(1u64..1000, 32),
        any::<bool>(),
    )
        .prop_map(|(id, mut factors, area)| {
            factors.truncate(id.region().rank());
            factors[0] += 1;
            let method = if area { Method::Area } else { Method::Nearest };
            let scale = Scale::new(factors, method).unwrap();
            ChunkId::scaled(id.array_id(), id.version(), id.region().clone(), scale).unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn scaled_round_trip_and_mutations_never_panic(id in any_scaled_id(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let bytes = id.encode();
        prop_assert_eq!(bytes.len(), 39 + id.array_id().len() + 24 * id.region().rank());
        prop_assert_eq!(ChunkId::decode(&bytes).unwrap(), id.clone());
        let n = cut.index(bytes.len());
        prop_assert!(ChunkId::decode(&bytes[..n]).is_err());
        let mut flipped = bytes.clone();
        flipped[flip.index(bytes.len())] ^= 1 << bit;
        if let Ok(other) = ChunkId::decode(&flipped) {
            prop_assert_eq!(other.encode(), flipped);
            prop_assert_ne!(other, id);
        }
    }

    #[test]
    fn round_trip(id in any_id()) {
        let bytes = id.encode();
        prop_assert_eq!(bytes.len(), 38 + id.array_id().len() + 16 * id.region().rank());
        prop_assert_eq!(ChunkId::decode(&bytes).unwrap(), id);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = ChunkId::decode(&bytes);
        let mut prefixed = b"TS\x01".to_vec();
        prefixed.extend_from_slice(&bytes);
        if let Ok(id) = ChunkId::decode(&prefixed) {
            prop_assert_eq!(id.encode(), prefixed);
        }
    }

    /// Truncations and bit flips of valid ids never panic, and whatever still
    /// decodes re-encodes to the same bytes (one id, one meaning).
    #[test]
    fn mutations_never_panic(id in any_id(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let bytes = id.encode();
        let n = cut.index(bytes.len());
        prop_assert!(ChunkId::decode(&bytes[..n]).is_err());
        let mut flipped = bytes.clone();
        flipped[flip.index(bytes.len())] ^= 1 << bit;
        if let Ok(other) = ChunkId::decode(&flipped) {
            prop_assert_eq!(other.encode(), flipped);
            prop_assert_ne!(other, id);
        }
    }
}
