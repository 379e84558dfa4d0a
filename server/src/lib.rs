//! Tessera server: sources → chunk grid → segment store → Arrow Flight wire.
//!
//! * [`source`] reads `.npy` files strictly (never evaluating headers).
//! * [`grid`] cuts a tensor into chunks of at most 64 MiB.
//! * [`chunk_id`] is the codec of the opaque chunk ids inside tickets.

pub mod chunk_id;
pub mod grid;
pub mod source;
