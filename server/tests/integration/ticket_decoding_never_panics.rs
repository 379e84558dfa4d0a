//! Bounded property tests of the decoders a client's bytes reach first: Flight tickets (also
//! the `chunk_locate` body) and GetFlightInfo commands. The fuzz targets in `server/fuzz`
//! (`ticket`, `flight_request`) explore the same space without bounds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use tessera_proto::pb::{SliceHint, TensorReadOption};
use tessera_proto::ticket::{
    TicketPayload, catalog_ticket, chunk_ticket, decode_flight_request, decode_ticket,
    flight_request,
};
use tessera_server::ChunkId;

fn any_read() -> impl Strategy<Value = TensorReadOption> {
    (
        "[a-z0-9_/.]{0,30}",
        prop::option::of((
            prop::collection::vec(any::<i64>(), 0..6),
            prop::collection::vec(any::<i64>(), 0..6),
        )),
        prop::collection::vec(any::<i64>(), 0..4),
        "[a-z]{0,8}",
    )
        .prop_map(
            |(array_id, slice, scale_hint, reduction_method)| TensorReadOption {
                array_id,
                slice_hint: slice.map(|(start, stop)| SliceHint { start, stop }),
                scale_hint,
                reduction_method,
                fields: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_ticket_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(TicketPayload::ChunkId(id)) = decode_ticket(&bytes) {
            prop_assert!(!id.is_empty());
            let _ = ChunkId::decode(&id);
        }
    }

    #[test]
    fn chunk_tickets_round_trip(id in prop::collection::vec(any::<u8>(), 1..200)) {
        let ticket = chunk_ticket(&id);
        prop_assert_eq!(decode_ticket(&ticket).unwrap(), TicketPayload::ChunkId(id));
    }

    #[test]
    fn catalog_tickets_round_trip(sql in "\\PC{0,200}") {
        let ticket = catalog_ticket(&sql);
        prop_assert_eq!(decode_ticket(&ticket).unwrap(), TicketPayload::CatalogQuery(sql));
    }

    /// Truncations and bit flips of a valid chunk ticket never panic, and never turn into a
    /// ticket with an empty chunk id.
    #[test]
    fn damaged_chunk_tickets_never_panic(
        id in prop::collection::vec(any::<u8>(), 1..120),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let ticket = chunk_ticket(&id);
        let truncated = &ticket[..cut.index(ticket.len())];
        if let Ok(TicketPayload::ChunkId(got)) = decode_ticket(truncated) {
            prop_assert!(!got.is_empty());
        }
        let mut flipped = ticket.clone();
        let at = flip.index(flipped.len());
        flipped[at] ^= 1 << bit;
        if let Ok(TicketPayload::ChunkId(got)) = decode_ticket(&flipped) {
            prop_assert!(!got.is_empty());
        }
    }

    #[test]
    fn random_command_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(read) = decode_flight_request(&bytes) {
            let again = decode_flight_request(&flight_request(read.clone())).unwrap();
            prop_assert_eq!(again, read);
        }
    }

    #[test]
    fn commands_round_trip(read in any_read()) {
        let cmd = flight_request(read.clone());
        prop_assert_eq!(decode_flight_request(&cmd).unwrap(), read.clone());
        // Every strict prefix is either refused or a valid (shorter) request; never a panic.
        for cut in 0..cmd.len() {
            let _ = decode_flight_request(&cmd[..cut]);
        }
    }
}
