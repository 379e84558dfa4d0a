//! The commands of the `tessera` binary that talk to a running server, written on
//! [`tessera_client::Client`]: `get`, `ls` and `stats` ([`remote`]), `warm` ([`warm`]) and
//! `put` ([`put`]); [`writable`] is `config check`'s test of the directories it names.
//! `tessera serve` runs [`tessera_server::Daemon`], with the binary's code kept in memory by
//! [`resident`]; `main.rs` only parses flags.

pub mod errors;
mod progress;
pub mod put;
pub mod remote;
pub mod resident;
pub mod warm;
pub mod writable;
