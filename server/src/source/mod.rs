//! Sources.
pub mod npy;
