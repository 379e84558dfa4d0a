//! The integration tests of `tessera-server`, one module per behaviour, in one test binary:
//! each test binary links the whole library (DataFusion included), so one per file cost about
//! 30 MB each (docs/decisions/0021). Run one with
//! `cargo test -p tessera-server --test integration MODULE::`.

mod grid_support;
mod npy_support;

mod catalog_tree_scale;
mod chunk_id_codec;
mod grid_policy;
mod grid_regions;
mod modules_form_layers;
mod npy_fixtures_bit_exact;
mod npy_header_never_panics;
mod npy_malformed_refused;
mod npy_source_changed;
mod segment_schema_is_the_chunk_schema;
mod ticket_decoding_never_panics;
