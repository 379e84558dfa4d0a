//! Wire-level tests of `tessera-proto`, one module per subject, in one test binary rather
//! than one per file (docs/decisions/0021). Run one with
//! `cargo test -p tessera-proto --test integration MODULE::`.

mod action_bodies;
mod compat_vectors;
mod wire_decoding;
