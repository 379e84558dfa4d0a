//! The wire: the Arrow Flight service speaking the biopb tensor protocol ([`flight`]), the
//! listener that admits its connections ([`listener`]) and the TLS certificate ([`tls`]).
//! Wire code only: what a call means lives below it, in `state`; the ledger of unread
//! replies it keeps per connection is `unread`, below both.

pub mod flight;
pub mod listener;
pub mod tls;
