//! The wire: the Arrow Flight service speaking the biopb tensor protocol ([`flight`]), the
//! HTTP API and viewer page ([`http`]), the listener that admits Flight connections
//! ([`listener`]) and the TLS certificate ([`tls`]). Wire code only: what a call means
//! lives below it, in `state` and `read_path`; the ledger of unread replies it keeps per
//! connection is `unread`, below both.

pub mod flight;
pub mod http;
pub mod listener;
pub mod tls;
