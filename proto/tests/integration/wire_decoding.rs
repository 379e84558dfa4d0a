//! Decoder behaviour beyond the pinned vectors: unpacked repeated scalars,
//! refusals of bad tickets and commands, fields the client relies on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use tessera_proto::pb::{
    ChunkBounds, ChunkRef, RoiRead, SliceHint, TensorDescriptor, TensorTicket, tensor_ticket,
};
use tessera_proto::{ProtoError, TicketPayload, decode_flight_request, decode_ticket};

#[test]
fn chunk_bounds_accept_unpacked_repeated_int64() {
    // Field 1 (start) as two varint records, field 2 (stop) likewise:
    // tag 0x08 = (1 << 3) | 0, tag 0x10 = (2 << 3) | 0.
    let unpacked = [0x08, 0x00, 0x08, 0x10, 0x10, 0x10, 0x10, 0x20];
    let bounds = ChunkBounds::decode(unpacked.as_slice()).unwrap();
    assert_eq!(bounds.start, [0, 16]);
    assert_eq!(bounds.stop, [16, 32]);
}

#[test]
fn descriptor_shape_accepts_mixed_packed_and_unpacked_records() {
    // shape (field 3): one packed record [48] then one unpacked record 64.
    let bytes = [0x1a, 0x01, 0x30, 0x18, 0x40];
    let desc = TensorDescriptor::decode(bytes.as_slice()).unwrap();
    assert_eq!(desc.shape, [48, 64]);
}

#[test]
fn slice_hint_with_negative_start_round_trips() {
    let hint = SliceHint {
        start: vec![-1, 0],
        stop: vec![i64::MAX, 7],
    };
    assert_eq!(
        SliceHint::decode(hint.encode_to_vec().as_slice()).unwrap(),
        hint
    );
}

#[test]
fn descriptor_optional_fields_keep_presence() {
    let desc = TensorDescriptor {
        content_version: Some(Vec::new()),
        is_resident: Some(false),
        ttl_seconds: Some(0),
        ..Default::default()
    };
    let bytes = desc.encode_to_vec();
    // Present-but-default values still go on the wire: 14, 16, 17.
    assert_eq!(hex::encode(&bytes), "7200800100880100");
    assert_eq!(TensorDescriptor::decode(bytes.as_slice()).unwrap(), desc);
}

#[test]
fn empty_ticket_is_refused_as_empty() {
    let err = decode_ticket(&[]).unwrap_err();
    assert!(matches!(err, ProtoError::EmptyTicket), "{err}");
    assert!(err.to_string().contains("no payload"));
}

#[test]
fn zero_length_chunk_id_is_refused() {
    let err = decode_ticket(&[0x0a, 0x00]).unwrap_err();
    assert!(matches!(err, ProtoError::EmptyChunkId), "{err}");
}

#[test]
fn garbage_ticket_is_refused_naming_the_message() {
    // Field 1, length 5, but only one byte follows.
    let err = decode_ticket(&[0x0a, 0x05, 0x01]).unwrap_err();
    assert!(
        matches!(
            err,
            ProtoError::Decode {
                what: "TensorTicket",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().starts_with("TensorTicket bytes are not"));
}

#[test]
fn roi_and_chunk_ref_tickets_name_their_arm() {
    let read = RoiRead {
        array_id: "img".to_string(),
        set_name: "nuclei".to_string(),
        grant: None,
    };
    let roi = TensorTicket {
        payload: Some(tensor_ticket::Payload::RoiRead(read.clone())),
    };
    assert_eq!(
        decode_ticket(&roi.encode_to_vec()).unwrap(),
        TicketPayload::RoiRead(read)
    );
    let chunk_ref = TensorTicket {
        payload: Some(tensor_ticket::Payload::ChunkRef(ChunkRef::default())),
    };
    assert_eq!(
        decode_ticket(&chunk_ref.encode_to_vec()).unwrap(),
        TicketPayload::Other("chunk_ref")
    );
}

#[test]
fn old_flight_cmd_envelope_is_refused_with_a_clear_message() {
    // FlightCmd{source_id = 1: "img", tensor_read = 2: {array_id: "img"}}.
    let old = hex::decode("0a03696d6712050a03696d67").unwrap();
    let err = decode_flight_request(&old).unwrap_err();
    assert!(matches!(err, ProtoError::MissingTensorRead), "{err}");
    assert!(err.to_string().contains("field 11"));
}

#[test]
fn empty_command_is_refused() {
    let err = decode_flight_request(&[]).unwrap_err();
    assert!(matches!(err, ProtoError::MissingTensorRead), "{err}");
}

#[test]
fn truncated_command_is_refused_naming_the_message() {
    let err = decode_flight_request(&[0x5a, 0x12, 0x0a]).unwrap_err();
    assert!(
        matches!(
            err,
            ProtoError::Decode {
                what: "FlightRequest",
                ..
            }
        ),
        "{err}"
    );
}
