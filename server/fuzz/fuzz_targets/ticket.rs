//! Fuzzes Flight ticket decoding (`TensorTicket`, also the `chunk_locate` body) down to the
//! chunk id, as do_get does: no input may panic; an accepted chunk ticket re-encodes to a
//! ticket that decodes to the same payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_proto::ticket::{TicketPayload, chunk_ticket, decode_ticket};
use tessera_server::chunk_id::ChunkId;

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = decode_ticket(data) else {
        return;
    };
    if let TicketPayload::ChunkId(id) = &payload {
        assert!(!id.is_empty(), "an empty chunk id was accepted");
        let again = decode_ticket(&chunk_ticket(id)).map_err(|e| e.to_string());
        assert_eq!(again, Ok(payload.clone()));
        let _ = ChunkId::decode(id);
    }
});
