//! Pins the hex test vectors of biopb-protocol.md §1 and §3.1 (made with the
//! `biopb==0.13.0` `_pb2` modules): our encoder must produce exactly these
//! bytes, and our decoder must read them back field for field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use prost_types::FieldMask;
use tessera_proto::pb::{ChunkBounds, SliceHint, TensorReadOption, TensorTicket, tensor_ticket};
use tessera_proto::{
    TicketPayload, catalog_ticket, chunk_ticket, decode_flight_request, decode_ticket,
    flight_request,
};

const PLAN_IMG_ENDPOINTS: &str = "5a120a03696d674a0b0a09656e64706f696e7473";
const PLAN_IMG_SLICED: &str = "5a1c0a03696d6712080a020305120228324a0b0a09656e64706f696e7473";
const CATALOG_SELECT_1: &str = "120a0a0853454c4543542031";
const BOUNDS_0_16_TO_16_32: &str = "0a02001012021020";
/// chunk_id of `img`, bounds [0,16]..[16,32]: u32be len, id, u16be ndim, i64be start, stop.
const CHUNK_ID_IMG: &str = concat!(
    "00000003",
    "696d67",
    "0002",
    "0000000000000000",
    "0000000000000010",
    "0000000000000010",
    "0000000000000020"
);

fn endpoints_mask() -> Option<FieldMask> {
    Some(FieldMask {
        paths: vec!["endpoints".to_owned()],
    })
}

fn read_img(slice_hint: Option<SliceHint>) -> TensorReadOption {
    TensorReadOption {
        array_id: "img".to_owned(),
        slice_hint,
        fields: endpoints_mask(),
        ..Default::default()
    }
}

fn slice_3_5_to_40_50() -> SliceHint {
    SliceHint {
        start: vec![3, 5],
        stop: vec![40, 50],
    }
}

#[test]
fn plan_command_for_img_with_endpoints_mask_encodes_to_vector() {
    assert_eq!(
        hex::encode(flight_request(read_img(None))),
        PLAN_IMG_ENDPOINTS
    );
}

#[test]
fn plan_command_for_img_with_endpoints_mask_decodes_from_vector() {
    let read = decode_flight_request(&hex::decode(PLAN_IMG_ENDPOINTS).unwrap()).unwrap();
    assert_eq!(read, read_img(None));
    assert_eq!(read.slice_hint, None);
}

#[test]
fn sliced_plan_command_encodes_to_vector() {
    let cmd = flight_request(read_img(Some(slice_3_5_to_40_50())));
    assert_eq!(hex::encode(cmd), PLAN_IMG_SLICED);
}

#[test]
fn sliced_plan_command_decodes_from_vector() {
    let read = decode_flight_request(&hex::decode(PLAN_IMG_SLICED).unwrap()).unwrap();
    assert_eq!(read.array_id, "img");
    assert_eq!(read.slice_hint, Some(slice_3_5_to_40_50()));
    assert_eq!(read.fields, endpoints_mask());
    assert!(read.scale_hint.is_empty());
    assert_eq!(read.reduction_method, "");
}

#[test]
fn catalog_ticket_select_1_encodes_to_vector() {
    assert_eq!(hex::encode(catalog_ticket("SELECT 1")), CATALOG_SELECT_1);
}

#[test]
fn catalog_ticket_select_1_decodes_from_vector() {
    let payload = decode_ticket(&hex::decode(CATALOG_SELECT_1).unwrap()).unwrap();
    assert_eq!(payload, TicketPayload::CatalogQuery("SELECT 1".to_owned()));
}

#[test]
fn chunk_bounds_encode_to_vector() {
    let bounds = ChunkBounds {
        start: vec![0, 16],
        stop: vec![16, 32],
    };
    assert_eq!(hex::encode(bounds.encode_to_vec()), BOUNDS_0_16_TO_16_32);
}

#[test]
fn chunk_bounds_decode_from_vector() {
    let bounds =
        ChunkBounds::decode(hex::decode(BOUNDS_0_16_TO_16_32).unwrap().as_slice()).unwrap();
    assert_eq!(bounds.start, [0, 16]);
    assert_eq!(bounds.stop, [16, 32]);
}

#[test]
fn chunk_ticket_is_0a29_then_the_41_byte_id() {
    let chunk_id = hex::decode(CHUNK_ID_IMG).unwrap();
    assert_eq!(chunk_id.len(), 41);
    let ticket = chunk_ticket(&chunk_id);
    assert_eq!(hex::encode(&ticket), format!("0a29{CHUNK_ID_IMG}"));
}

#[test]
fn chunk_ticket_decodes_to_the_same_id() {
    let chunk_id = hex::decode(CHUNK_ID_IMG).unwrap();
    let bytes = hex::decode(format!("0a29{CHUNK_ID_IMG}")).unwrap();
    assert_eq!(
        decode_ticket(&bytes).unwrap(),
        TicketPayload::ChunkId(chunk_id.clone())
    );
    // The generated message agrees with the helper.
    let ticket = TensorTicket::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        ticket.payload,
        Some(tensor_ticket::Payload::ChunkId(chunk_id))
    );
}
