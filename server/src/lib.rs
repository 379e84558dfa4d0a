//! Tessera server: sources → chunk grid → segment store → Arrow Flight wire.
//!
//! * [`source`] reads `.npy` files strictly (never evaluating headers) and keeps
//!   the registry of served sources.
//! * [`grid`] cuts a tensor into chunks of at most 64 MiB; [`route`] picks the grid a plan
//!   is cut on (fine for sockets, coarse for mapping clients).
//! * [`chunk_id`] is the codec of the opaque chunk ids inside tickets.
//! * [`scaled`] validates downsampled reads, reduces scaled chunks and plans the pyramid.
//! * [`chunks`] decodes chunks once and keeps them in the segment store (or RAM).
//! * [`state`] is what the service shares between calls, below the wire; [`flight`] is the
//!   Arrow Flight service speaking the biopb tensor protocol; [`error`] is its one error type
//!   and the one mapping of it to gRPC status.
//! * [`catalog`] answers SQL over the `sources` and `tensors` tables (DataFusion).
//! * [`daemon`] and [`config`] run it as a long-lived process; [`watch`] rescans served
//!   folders; [`tls`] loads its certificate;
//!   [`listener`] admits connections and [`pins`] closes those whose unread replies stall.
//! * [`state_dir`] holds what users write (uploads, annotations), locked for one server.
//! * [`uploads`] keeps the tensors clients write (`add_tensor`, DoPut) in the state directory.
//! * [`rois`] stores the ROI annotations users draw on tensors, in the state directory.
//! * [`metrics`] is the handle that records Prometheus metrics; [`scrape`] serves them.
//!
//! The `tessera` binary (crate `tessera-cli`) runs the daemon and the tools around it.

pub mod catalog;
pub mod chunk_id;
pub mod chunks;
pub mod config;
pub mod daemon;
pub mod error;
pub mod flight;
pub mod grid;
pub mod listener;
pub mod metrics;
pub mod pins;
pub mod read_path;
pub mod reopening_db;
pub mod rois;
pub mod route;
pub mod scaled;
pub mod scrape;
pub mod source;
pub mod state;
pub mod state_dir;
pub mod tls;
pub mod uploads;
pub mod watch;
