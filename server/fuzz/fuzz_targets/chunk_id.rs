//! Fuzzes the chunk-id decoder (the opaque id inside every chunk ticket): no input may
//! panic, and whatever decodes must re-encode to exactly the same bytes (one encoding per id,
//! so a forged id cannot alias a real one).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_server::chunk_id::ChunkId;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = ChunkId::decode(data) {
        assert_eq!(id.encode(), data, "decoding is not canonical");
        assert!(id.region().start.len() == id.region().stop.len());
        // The segment key is derived without panicking, whatever the region.
        let _ = id.segment_key();
    }
});
