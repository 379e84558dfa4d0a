//! Tessera server: sources → chunk grid → segment store → Arrow Flight wire.
//!
//! * [`source`] reads `.npy` files strictly (never evaluating headers) and keeps
//!   the registry of served sources.
//! * [`grid`] cuts a tensor into chunks of at most 64 MiB.
//! * [`chunk_id`] is the codec of the opaque chunk ids inside tickets.
//! * [`chunks`] decodes chunks once and keeps them in the segment store (or RAM).
//! * [`flight`] is the Arrow Flight service speaking the biopb tensor protocol.
//! * [`daemon`] and [`config`] run it as a long-lived process.

pub mod chunk_id;
pub mod chunks;
pub mod config;
pub mod daemon;
pub mod error;
pub mod flight;
pub mod grid;
pub mod source;
