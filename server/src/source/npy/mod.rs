//! The strict `.npy` reader.
//!
//! A `.npy` file is the magic `\x93NUMPY`, a version (1.0, 2.0 or 3.0), a header length
//! (u16 for 1.0, u32 after), a header that is a Python dict literal, then the raw payload.
//! This reader never evaluates the header: it accepts exactly the dicts numpy writes, with
//! the keys `descr`, `fortran_order` and `shape` (see the grammar in [`parse_header`]), and
//! refuses everything else with a typed [`NpyError`] naming the file and what was refused.
//!
//! # What is served
//! * dtypes `b1`, `i1 i2 i4 i8`, `u1 u2 u4 u8`, `f2 f4 f8`, `c8 c16` in either byte order,
//!   carried as written (`>i2` stays big-endian); `=` becomes the host's explicit order.
//!   The object dtype (`|O`, whose payload is a pickle) is refused by name before anything
//!   else in the header is looked at; structured and all other dtypes are refused naming them.
//! * shapes of rank 1 and above, zero-length axes included; a scalar shape `()` is refused.
//!   Element count and byte size are overflow-checked and bounded by [`Limits`] before
//!   anything is allocated or mapped; so is the header length, before the header is read.
//! * C and Fortran order: every read returns C-order bytes, gathered when the file is in
//!   Fortran order. Non-finite floats are carried untouched.
//! * the payload must be at least the declared size (a truncated file is refused when it is
//!   opened); trailing bytes are ignored, as numpy does.
//! * the preamble plus header must be a multiple of 16 bytes (numpy writes 64, old files 16).
//!
//! # Two ways in
//! * Owned: [`NpyFile`] opens a path, reads only the header, and serves regions with
//!   positional reads straight into the caller's buffer (no memory map, so a file shrunk
//!   underneath gives an error, never `SIGBUS`; every read re-checks the file's identity).
//!   [`NpyFile::read_all`] and [`read_stream`] read a whole array into a buffer they own.
//! * Borrowed: [`NpyView`] checks bytes the caller holds (e.g. a memory map) and serves the
//!   payload and regions without copying until the one copy into the caller's buffer;
//!   [`NpyView::region_runs`] hands out the payload slices themselves.
//!
//! # Fuzzing
//! The header parser has a `cargo fuzz` target in `server/fuzz` (its own workspace, outside
//! the main one). It needs a nightly toolchain and `cargo install cargo-fuzz`:
//!
//! ```text
//! cd server/fuzz
//! mkdir -p corpus/npy_header
//! ../../.venv/bin/python ../../tests/fixtures/make_npy_fixtures.py corpus/npy_header
//! cargo +nightly fuzz run npy_header corpus/npy_header -- -max_total_time=300
//! ```
//!
//! The target feeds arbitrary bytes to [`parse_header`] and [`NpyView::new`], and reads
//! regions of whatever parses; any panic is a bug.

mod dtype;
mod error;
mod file;
pub mod handles;
mod header;
mod limits;
mod region;
mod source;
mod stream;
mod view;
mod writers;

pub use dtype::{ByteOrder, Dtype, Kind};
pub use error::NpyError;
pub use file::{NpyFile, Placement};
pub(crate) use file::{open_placed, touched_within};
pub use header::{Header, parse_header};
pub use limits::Limits;
pub use region::region_is_contiguous;
pub(crate) use region::{Runs, gather, stored_runs};
pub use source::open_source;
pub use stream::read_stream;
pub use view::{NpyView, RegionRuns};
pub(crate) use writers::{Writers, probe as probe_writers};
